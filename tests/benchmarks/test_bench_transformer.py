"""benchmarks/bench_transformer.py: the set decode covers every sentence once, in batches of at most --set-batch,
and each sentence runs the full --decode-len steps (EOS masked), so the timed work is what the header says."""

from __future__ import annotations

import pytest
import torch
from conftest import load_benchmark

from hyperplex.models.search import decode


@pytest.mark.parametrize("sentences,batch,sizes", [(1014, 64, [64] * 15 + [54]), (5, 2, [2, 2, 1]), (3, 8, [3]),
                                                   (0, 4, [])])
def test_set_batches_cover_every_sentence_once(sentences, batch, sizes):
    assert load_benchmark("bench_transformer").set_batches(sentences, batch) == sizes


def test_every_sentence_of_a_set_batch_is_decoded_to_the_step_limit():
    bench = load_benchmark("bench_transformer")
    args = bench.parse_args(["--quick", "--set-sentences", "5", "--set-batch", "2"])
    model = bench.build_models(args, torch.device("cpu"))["phm4"]
    src = torch.randint(4, args.vocab, (3, args.src_len), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        hypotheses = decode(model.eval(), src, torch.full((3,), args.src_len), beam_size=args.beam,
                            beam_alpha=args.alpha, max_output_length=args.decode_len)
    assert len(hypotheses) == 3
    assert all(len(h[0].tokens) == args.decode_len and model.eos_index not in h[0].tokens for h in hypotheses)
    with pytest.raises(SystemExit):
        bench.parse_args(["--quick", "--set-sentences", "-1"])


def test_compile_adds_each_models_compiled_step_timed_in_the_same_rounds(tmp_path):
    bench = load_benchmark("bench_transformer")
    result = bench.main(["--quick", "--compile", "--repeats", "1", "--threads", "1", "--out", str(tmp_path / "t.json")])
    eager = {row["name"]: row for row in result["rows"]}
    compiled = {row["name"]: row for row in result["compiled"]}
    assert compiled.keys() == eager.keys() == {"transformer", "quaternion", "phm4", "phm8"}
    for name, row in compiled.items():
        assert row["eager_s_per_100"] == eager[name]["train_s_per_100"]
        # one round: each ratio is that round's pair of times
        assert row["ratio_to_eager"] == pytest.approx(row["train_s_per_100"] / row["eager_s_per_100"])
        assert row["train_ratio"] == pytest.approx(row["train_s_per_100"] / eager["transformer"]["train_s_per_100"])
        assert row["compile_s"] > 0
