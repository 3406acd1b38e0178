"""Command-line interface: ``hyperplex {demo,train,compress,score-encoder,corpus,evaluate,translate,params,average,
experiment,report,export,native,config-reference}``. Benchmarks are scripts of a source checkout
(``python benchmarks/bench_phm.py``), not verbs.

Errors end with one line on stderr saying what is wrong and where, and exit code 1 (2 for
usage errors); ``--debug`` shows the traceback instead (``experiment``, ``report`` and ``config-reference``
describe their input errors in one line either way).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys


def _guard(outputs: dict, inputs=(), owns=()) -> None:
    """Refuse an output that is an input, another model's file or not a regular file, before any work
    (:func:`hyperplex.guards.check_outputs`)."""
    from hyperplex.guards import check_outputs

    check_outputs(outputs, inputs, owns)


def _demo(args: argparse.Namespace) -> int:
    from hyperplex.experiments.demo import run_demo
    from hyperplex.guards import check_output_folder
    from hyperplex.threads import parse_threads

    check_output_folder(args.out, "--out", ())  # plots only: never into a model's folder
    run_demo(args.out, quick=args.quick, seed=args.seed, threads=parse_threads(args.threads))
    return 0


def _train(args: argparse.Namespace) -> int:
    from hyperplex.train.run import train

    metrics = train(args.config, args.overrides, args.model_dir, args.data_root, args.resume)
    if metrics:
        print(json.dumps({k: round(v, 4) for k, v in metrics.items()}))
    return 0


def _compress(args: argparse.Namespace) -> int:
    from hyperplex.train.run import compress

    metrics = compress(args.config, args.overrides, args.model_dir, args.data_root, args.resume)
    if metrics:
        print(json.dumps({k: round(v, 4) for k, v in metrics.items()}))
    return 0


def _score_encoder(args: argparse.Namespace) -> int:
    from hyperplex.cli.score_encoder import format_table
    from hyperplex.scoring import score_encoders

    files = {"agreement": args.agreement, "wikiqa": args.wikiqa, "sst2": args.sst2}
    _guard({"--json": args.json}, [*args.students, args.teacher, *files.values()])
    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
    result = score_encoders(args.students, args.teacher, args.data_root, files, metrics, args.probe_train,
                            args.probe_test, args.split_seed, args.json, args.threads)
    print(format_table(result))
    return 0


def _corpus(args: argparse.Namespace) -> int:
    from hyperplex.cli.corpus_verb import run_corpus

    run_corpus(args.out, args.data_root, args.exclude, args.min_sentences, args.shuffle_seed, quiet=args.quiet)
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    from hyperplex.inference.verbs import evaluate

    metrics = evaluate(args.model_dir, args.checkpoint, args.split, args.data_root, args.beam_size,
                       threads=args.threads)
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in metrics.items()}))
    return 0


def _translate(args: argparse.Namespace) -> int:
    from hyperplex.inference.verbs import translate

    _guard({"-o": args.output, "--plot-attention": args.plot_attention}, [args.input, args.model_dir, args.checkpoint])
    translate(args.model_dir, args.input, args.output, args.checkpoint, args.beam_size, args.plot_attention,
              threads=args.threads)
    return 0


def _params(args: argparse.Namespace) -> int:
    from hyperplex.inference.parameters import params

    print(params(args.config, args.overrides, args.vocab_size, args.tgt_vocab_size, args.num_classes))
    return 0


def _average(args: argparse.Namespace) -> int:
    from hyperplex.train.checkpoint import write_average

    print(write_average(args.inputs, args.output))  # its output guard is the Python call's too
    return 0


def _export(args: argparse.Namespace) -> int:
    from hyperplex.inference.export import export

    if not args.st_folder:  # --st-folder writes a new folder and refuses any existing path itself
        _guard({"OUT": args.output}, [args.model, args.checkpoint], owns=("*.onnx",))
    result, tensor_bytes = export(args.model, args.output, args.checkpoint, args.token_embeddings, args.opset,
                                  args.data_root, args.phm, args.st_folder)
    diff = "not checked (onnxruntime missing)" if result.max_abs_diff is None else f"{result.max_abs_diff:.2g}"
    tensors = "" if tensor_bytes is None else f" (tensors of the model: {tensor_bytes / 1e6:.2f} MB)"
    print(f"wrote {result.path}: {result.bytes / 1e6:.2f} MB{tensors}; "
          f"inputs {', '.join(result.input_names)} -> {', '.join(result.output_names)}; "
          f"max |onnxruntime - PyTorch| = {diff}")
    if args.st_folder:
        print("load it with sentence-transformers' ONNX backend: "
              f"SentenceTransformer({args.output!r}, backend=\"onnx\")")
    return 0


def _experiment(args: argparse.Namespace) -> int:
    from hyperplex.experiments.cli import run

    return run(args, args.command_line)


def _add_overrides(p: argparse.ArgumentParser) -> None:
    p.add_argument("overrides", nargs="*", metavar="--SECTION.KEY=VALUE",
                   help="override any config key, e.g. --training.lr=3e-4 --model.linear.n=8")


def _add_threads(p: argparse.ArgumentParser) -> None:
    # parsed by hyperplex.threads.parse_threads, so a bad value is the usual one-line error naming --threads
    p.add_argument("--threads", default="0", metavar="N",
                   help="torch CPU threads; 0 (default) = chosen from the model size, the batch and the "
                   "available cores (see hyperplex/threads.py)")


def _add_run_arguments(p: argparse.ArgumentParser, data_root: dict, config_help: str, resume_help: str) -> None:
    """The arguments of the verbs that train (train, compress): config, model folder, data root, resume,
    and the config overrides."""
    p.add_argument("config", help=config_help)
    p.add_argument("--model-dir", help="model folder (overrides the config's model_dir)")
    p.add_argument("--data-root", **data_root)
    p.add_argument("--resume", action="store_true", help=resume_help)
    _add_overrides(p)


#: ``--data-root`` of the verbs that read a config's data.
_DATA_ROOT = dict(default=None, help="folder that relative data paths in the config are read from "
                  "(default: $HYPERPLEX_DATA, else ../shared/data if present)")
#: MODEL of the verbs that load a trained model.
_MODEL_HELP = ("model folder written by `hyperplex train`, or a checkpoint file (.safetensors): its stored "
               "config is used unless a config.yaml sits beside it, and its tokeniser/vocabulary files "
               "(the names it records, e.g. src.json, src_vocab.json) are read from its folder")


def _add_demo(sub, common: argparse.ArgumentParser) -> None:
    """``hyperplex demo``'s arguments."""
    demo = sub.add_parser(
        "demo", parents=[common],
        help="PHM paper Fig. 2 on generated data: learn a 3-D rotation and the quaternion/octonion rules",
        description="Learn a 3-D rotation with a PHM layer, and learn the quaternion (n=4) and octonion (n=8) "
        "multiplication rules from examples of products; print a table and write plots.")
    demo.add_argument("--quick", action="store_true",
                      help="1,000 training steps instead of 6,000 (the whole command: 10 s of CPU time "
                      "instead of 19 s on our 2-core test machine, start-up and plots included; used by the tests)")
    demo.add_argument("--out", default="runs/demo", help="folder for the plots (default: runs/demo)")
    demo.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    _add_threads(demo)
    demo.set_defaults(func=_demo)


def _add_train(sub, common: argparse.ArgumentParser) -> None:
    """``hyperplex train``'s arguments."""
    train = sub.add_parser("train", parents=[common], help="train a model from a YAML config",
                           description="Train (or --resume) the experiment a YAML config describes. Everything "
                           "is written to the model folder: config.yaml, train.log, metrics.csv, TensorBoard "
                           "events, last/best checkpoints, vocabularies and plots.")
    _add_run_arguments(train, _DATA_ROOT, "YAML config (see configs/ and docs/config.md)",
                       "continue from MODEL_DIR/last.safetensors exactly (same data order, optimizer and RNG)")
    train.set_defaults(func=_train)


def _add_compress(sub, common: argparse.ArgumentParser) -> None:
    """``hyperplex compress``'s arguments."""
    compress = sub.add_parser("compress", parents=[common],
                              help="heal a converted pretrained model by distilling from its teacher",
                              description="Train a `data.task: distillation` config exactly like `train` (same "
                              "model folder contents, --resume), then write the best checkpoint's student with "
                              "hyperplex.convert.save_converted into MODEL_DIR/student (load it with "
                              "hyperplex.convert.load_converted; with testing.quantize: int8, save_quantized and "
                              "load_quantized). See docs/compress.md.")
    _add_run_arguments(compress, _DATA_ROOT,
                       "YAML config with data.task: distillation (e.g. configs/minilm_compress.yaml)",
                       "continue from MODEL_DIR/last.safetensors exactly, then write student/")
    compress.set_defaults(func=_compress)


def _add_score_encoder(sub, common: argparse.ArgumentParser) -> None:
    """``hyperplex score-encoder``'s arguments."""
    score = sub.add_parser(
        "score-encoder", parents=[common],
        help="score compressed sentence encoders next to their teacher: agreement, WikiQA, SST-2 probe, size",
        description="Score each STUDENT and its teacher on the same data and print one markdown table, the "
        "teacher first: agreement (mean cosine to the teacher's embeddings), zero-shot WikiQA MAP/MRR (answers "
        "ranked by cosine to the question), the accuracy of an SST-2 logistic-regression probe on frozen "
        "embeddings, parameters (whole model and converted layers) and file size. See docs/compress.md.")
    score.add_argument("students", nargs="+", metavar="STUDENT",
                       help="a folder written by hyperplex.convert.save_converted, or a `hyperplex compress` model "
                       "folder (its student/, else its best checkpoint, else its last)")
    score.add_argument("--teacher", metavar="minilm|PATH",
                       help="the teacher: `minilm` or a SentenceTransformer folder (default: the model.path the "
                       "students' config.yaml records; required for a save_converted folder of your own)")
    score.add_argument("--data-root", default=None, help="folder the relative --agreement/--wikiqa/--sst2 files "
                       "are read from (default: $HYPERPLEX_DATA, else ../shared/data if present)")
    score.add_argument("--agreement", metavar="FILE",
                       help="sentences for agreement, one per line (default: tatoeba_en_fr/dev.en.gz)")
    score.add_argument("--wikiqa", metavar="FILE", help="WikiQA JSON lines (default: wikiqa/dev.jsonl.gz)")
    score.add_argument("--sst2", metavar="FILE", help="SST-2 sentence<TAB>label file (default: sst2/train.tsv.gz)")
    score.add_argument("--metrics", default="agreement,wikiqa,sst2", metavar="LIST",
                       help="comma-separated subset of agreement,wikiqa,sst2 (default: all three)")
    score.add_argument("--probe-train", type=int, default=2000, metavar="N",
                       help="SST-2 probe training sentences (default: 2000)")
    score.add_argument("--probe-test", type=int, default=1000, metavar="N",
                       help="SST-2 probe test sentences, disjoint from the training ones (default: 1000)")
    score.add_argument("--split-seed", type=int, default=0, metavar="S",
                       help="seed of the SST-2 train/test carve (default: 0)")
    score.add_argument("--json", metavar="OUT", help="also write the numbers as JSON to OUT")
    _add_threads(score)
    score.set_defaults(func=_score_encoder)


def _add_corpus(sub, common: argparse.ArgumentParser) -> None:
    """``hyperplex corpus``'s arguments."""
    corpus = sub.add_parser(
        "corpus", parents=[common],
        help="build the distillation corpus: distinct sentences from the data folder, evaluation sentences removed",
        description="Read SNLI premises and hypotheses, Tatoeba English (train), IMDb reviews split into "
        "sentences, WikiQA train questions and answers, Shakespeare (modern and original, train) and Multi30k "
        "English (train) from the data root (the Linzen agreement prefixes too, only when those give fewer than "
        "--min-sentences); drop duplicates (compared after folding case, accents and spacing as MiniLM's uncased "
        "tokenizer does) and every sentence whose letters and digits, so folded, are those of a sentence of an "
        "evaluation file (punctuation and spacing ignored); shuffle with --shuffle-seed, so any "
        "prefix is a sample of every source; write OUT (one sentence per line, gzip if it ends .gz) and a JSON "
        "report of the counts per source beside it (OUT without .gz/.txt + .report.json). The default evaluation "
        "files, always removed: tatoeba_en_fr/dev.en.gz, wikiqa/dev.jsonl.gz, multi30k_en_de/val.en.gz and every row "
        "of sst2/train.tsv.gz (which is therefore no source). A missing file, or too few sentences, is one error "
        "and nothing is written. Use OUT as data.train of a distillation config. See docs/compress.md.")
    corpus.add_argument("out", metavar="OUT", help="the corpus file to write, e.g. corpus/distill.txt.gz")
    corpus.add_argument("--data-root", default=None, help="folder the sources and relative --exclude files are "
                        "read from (default: $HYPERPLEX_DATA, else ../shared/data if present)")
    corpus.add_argument("--exclude", nargs="+", default=[], metavar="FILE",
                        help="more evaluation files whose sentences are removed, besides the defaults: text (one "
                        "per line), .jsonl (question/answer/premise/hypothesis/sentence/text fields) or .tsv "
                        "(the sentence or text column)")
    corpus.add_argument("--min-sentences", type=int, default=500_000, metavar="N",
                        help="fewest distinct sentences the corpus must hold (default: 500000)")
    corpus.add_argument("--shuffle-seed", type=int, default=0, metavar="S", help="seed of the shuffle (default: 0)")
    corpus.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    corpus.set_defaults(func=_corpus)


def _add_evaluate(sub, common: argparse.ArgumentParser) -> None:
    """``hyperplex evaluate``'s arguments."""
    evaluate = sub.add_parser("evaluate", parents=[common], help="metrics of a trained model on its validation split",
                              description="Load a model folder (or a checkpoint file with its vocabulary files "
                              "beside it) and print its validation metrics as JSON "
                              "(translation: BLEU/chrF with the configured beam, loss, perplexity).")
    evaluate.add_argument("model_dir", metavar="MODEL", help=_MODEL_HELP)
    evaluate.add_argument("--split", default="dev", metavar="dev|train|FILE",
                          help="dev (default), train (not for translation, whose references are not kept), or "
                          "a file in the task's format — "
                          "a parallel prefix for translation — e.g. linzen_agreement/numpred.test.1.gz")
    evaluate.add_argument("--checkpoint", default="best",
                          help="with a model folder: best (default), last, or a checkpoint file")
    evaluate.add_argument("--beam-size", type=int, help="override testing.beam_size")
    evaluate.add_argument("--data-root", **_DATA_ROOT)
    _add_threads(evaluate)
    evaluate.set_defaults(func=_evaluate)


def _add_translate(sub, common: argparse.ArgumentParser) -> None:
    """``hyperplex translate``'s arguments."""
    translate = sub.add_parser("translate", parents=[common], help="translate sentences with a trained model",
                               description="Translate one sentence per line from a file or stdin to a file or "
                               "stdout, with the model folder's tokenisers, vocabularies and decoding settings "
                               "(or a checkpoint file's, with its vocabulary files beside it).")
    translate.add_argument("model_dir", metavar="MODEL", help=_MODEL_HELP)
    translate.add_argument("-i", "--input", help="input file (default: stdin)")
    translate.add_argument("-o", "--output", help="output file (default: stdout); never the input, nor a file a model "
                           "folder already holds (refused before translating)")
    translate.add_argument("--checkpoint", default="best",
                           help="with a model folder: best (default), last, or a checkpoint file")
    translate.add_argument("--beam-size", type=int, help="override testing.beam_size (1 = greedy)")
    translate.add_argument("--plot-attention", metavar="PNG",
                           help="draw the attention heat-map of the first non-empty sentence (the same rule as -o)")
    _add_threads(translate)
    translate.set_defaults(func=_translate)


def _add_params(sub, common: argparse.ArgumentParser) -> None:
    """``hyperplex params``'s arguments."""
    params = sub.add_parser("params", parents=[common], help="parameter counts per component of a config's model",
                            description="Build the model a config describes (no data is read) and print its "
                            "parameters per component: embeddings, attention, FFN/recurrent, output layer, PHM "
                            "rules, total with and without embeddings.")
    params.add_argument("config", help="YAML config")
    params.add_argument("--vocab-size", type=int,
                        help="vocabulary size (default: data.vocab_size; arithmetic data and pretrained encoders "
                        "bring their own)")
    params.add_argument("--tgt-vocab-size", type=int, help="target vocabulary size (default: the same)")
    params.add_argument("--num-classes", type=int,
                        help="classes (default: data.labels, at least 2; a ranking model has one score)")
    _add_overrides(params)
    params.set_defaults(func=_params)


def _add_average(sub, common: argparse.ArgumentParser) -> None:
    """``hyperplex average``'s arguments."""
    average = sub.add_parser("average", parents=[common], help="average the weights of several checkpoints",
                             description="Average model weights of checkpoint files (or of every "
                             "best-*.safetensors in a model folder) into one weights file.")
    average.add_argument("inputs", nargs="+", help="checkpoint files and/or model folders")
    average.add_argument("-o", "--output", required=True, help="output .safetensors file (or folder: "
                         "averaged.safetensors in it); never an input, nor another file of a model folder")
    average.set_defaults(func=_average)


def _add_experiment(sub, common: argparse.ArgumentParser) -> None:
    """``hyperplex experiment``'s arguments."""
    from hyperplex.experiments.cli import add_arguments as add_experiment_arguments

    experiment = sub.add_parser(
        "experiment", parents=[common], help="run an experiment plan: train every row × seed, evaluate, report",
        description="Validate a plan (experiments/*.yaml), train each row × seed into OUT/ROW/seedK, evaluate "
        "every finished model and write OUT/results.{md,json}: mean ± std [95% t-interval] over seeds, parameters, "
        "training time, with the command, machines and dates. See experiments/README.md.")
    add_experiment_arguments(experiment)
    experiment.set_defaults(func=_experiment)


def _add_export(sub, common: argparse.ArgumentParser) -> None:
    """``hyperplex export``'s arguments."""
    export = sub.add_parser(
        "export", parents=[common], help="write a converted encoder or a Transformer classifier as ONNX",
        description="Write MODEL as an ONNX graph holding the PHM / low-rank factors (not the dense H), with dynamic "
        "batch and sequence axes, checked in onnxruntime (the onnx extra; without it, written unchecked, as the "
        "output says) against PyTorch before the file is put in place. MODEL: a "
        "save_converted folder or a `hyperplex compress` model folder (a SentenceTransformer: input_ids, "
        "attention_mask -> sentence_embedding), or a `hyperplex train` folder or checkpoint of a "
        "TransformerClassifier (tokens, lengths -> logits). --st-folder writes a folder for sentence-transformers' "
        "ONNX backend instead of one file. See docs/compress.md.")
    export.add_argument("model", metavar="MODEL", help="model folder or checkpoint file")
    export.add_argument("output", metavar="OUT", help="the .onnx file to write (replaced atomically); with "
                        "--st-folder, the new folder to write")
    export.add_argument("--checkpoint", default="best",
                        help="for a `hyperplex train` folder: best (default), last, or a checkpoint file")
    export.add_argument("--token-embeddings", action="store_true",
                        help="for a SentenceTransformer: export its transformer's last_hidden_state instead of the "
                        "pooled sentence_embedding (the layout sentence-transformers' ONNX backend reads)")
    export.add_argument("--phm", choices=("premixed", "structured", "materialized"), default="premixed",
                        help="how PHM layers are written; the file holds the factors A_i, S_i in every mode. premixed "
                        "(default): input blocks mixed by the rule, then one GEMM against the S_i side by side; "
                        "structured: one GEMM over the input blocks, then the n^2 partial products mixed; both never "
                        "form H. materialized: the graph forms H, which onnxruntime folds once when it opens the file "
                        "(the dense model's speed and memory)")
    export.add_argument("--st-folder", action="store_true",
                        help="for a SentenceTransformer folder: write OUT as a new folder that sentence-transformers' "
                        "ONNX backend loads (SentenceTransformer(OUT, backend='onnx')): onnx/model.onnx (the "
                        "token-embedding graph, factors only) beside the model's tokenizer, config and pooling "
                        "modules, no PyTorch weights")
    export.add_argument("--opset", type=int, default=17, help="ONNX opset (default: 17)")
    export.add_argument("--data-root", **_DATA_ROOT)
    export.set_defaults(func=_export)


def _native(args: argparse.Namespace) -> int:
    import time

    from hyperplex.layers import native

    if args.uninstall:
        marker = native.uninstall_native_kernels()
        print(f"removed {marker}: PHM layers stay on PyTorch's paths unless {native.ENV_VAR}=1 or "
              "enable_native_kernels() turns the kernel on" if marker else
              "the native PHM kernel was not installed for this CPU, source and torch: nothing to remove")
        return 0
    start = time.perf_counter()
    installed = native.install_native_kernels(verbose=args.verbose)
    results = installed["self_check"]
    print(f"native PHM kernel: {installed['library']} (built or loaded, and checked, in "
          f"{time.perf_counter() - start:.1f} s)")
    worst = max(results, key=lambda r: r["error"])
    print(f"self-check against the Kronecker product, {len(results)} shapes (n = "
          f"{', '.join(str(r['n']) for r in results)}): largest error {worst['error']:.1e} of the largest output "
          f"(at n={worst['n']}, {worst['d']} -> {worst['k']}), within {native.SELF_CHECK_TOLERANCE:.0e}")
    print(f"installed ({installed['marker']}): in every process on this machine, PHM layers in forward_mode='auto' "
          f"take it in inference at up to {native.STREAMED_ROW_LIMIT} rows on layers with at least "
          f"{native.STREAMED_MIN_FACTORS:,} numbers in their factors; {native.ENV_VAR}=0 turns it off, "
          "hyperplex native --uninstall removes the mark")
    if native._env_mode() == "off":
        print(f"note: {native.ENV_VAR}={os.environ[native.ENV_VAR]} in this environment keeps it off here")
    return 0


def _add_native(sub, common: argparse.ArgumentParser) -> None:
    """``hyperplex native``'s arguments."""
    native = sub.add_parser(
        "native", parents=[common], help="build, check and install the optional compiled PHM kernel",
        description="Build hyperplex's compiled streamed PHM kernel for this machine, or load the copy cached in "
        "TORCH_EXTENSIONS_DIR, check it against the Kronecker product on random layers, and install it: later "
        "processes on this machine (same CPU, hyperplex and torch) with HYPERPLEX_NATIVE unset let PHM layers in "
        "forward_mode='auto' take it in inference at few rows, loading it without a compiler. Building needs a C++ "
        "compiler and ninja (pip install 'hyperplex[native]'; about a minute). HYPERPLEX_NATIVE=0 keeps it off "
        "anyway. See docs/phm.md.")
    native.add_argument("--verbose", action="store_true", help="show the compiler's output")
    native.add_argument("--uninstall", action="store_true",
                        help="remove the install mark (the compiled library stays cached); nothing is built")
    native.set_defaults(func=_native)


def _add_report(sub, common: argparse.ArgumentParser) -> None:
    from hyperplex.cli.report_verb import add_report

    add_report(sub, common)


def _add_config_reference(sub, common: argparse.ArgumentParser) -> None:
    from hyperplex.cli.report_verb import add_config_reference

    add_config_reference(sub, common)


class _VersionAction(argparse.Action):
    """``--version``: hyperplex's version with torch's and its CUDA build's, the three that a bug report needs;
    torch is imported only when it is asked for, so the other verbs' ``--help`` stays quick."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0,
                         help=help or "print hyperplex's, torch's and CUDA's versions and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        import torch

        from hyperplex._version import __version__

        cuda = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU build"
        print(f"hyperplex {__version__} (torch {torch.__version__}, {cuda})")  # stdout, as argparse's own
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    """The ``hyperplex`` parser: one subparser per verb, each added by its ``_add_VERB`` function."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show the full traceback of an error instead of its one line (experiment, report "
                        "and config-reference describe bad input, a missing file or a bad plan, in one line either "
                        "way)")
    parser = argparse.ArgumentParser(
        prog="hyperplex", parents=[common],
        description="Parameterized hypercomplex multiplication (PHM) layers and quaternion networks for NLP.")
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (_add_demo, _add_train, _add_compress, _add_score_encoder, _add_corpus, _add_evaluate, _add_translate,
                _add_params, _add_average, _add_experiment, _add_report, _add_export,
                _add_native, _add_config_reference):  # the order `hyperplex --help` lists
        add(sub, common)
    return parser


def _split_overrides(argv: list[str], own: frozenset[str] = frozenset()) -> tuple[list[str], list[str]]:
    """Separate config overrides — any dotted long option (``--section.key=value``) or a top-level config
    key (``--seed=3``) — from the other arguments, except the verb's ``own`` options (``demo --seed``). One
    without a value is kept as it is, for the config loader to reject with a message naming it (and the verb),
    rather than an argparse usage error."""
    from dataclasses import fields

    from hyperplex.config.experiment import ExperimentConfig

    top = {f.name for f in fields(ExperimentConfig)}
    rest, overrides = [], []
    i = 0
    while i < len(argv):
        arg = argv[i]
        key = arg.split("=", 1)[0]
        if arg.startswith("--") and key not in own and ("." in key or key[2:] in top):
            if "=" not in arg and i + 1 < len(argv) and not argv[i + 1].startswith("--"):  # --training.lr 3e-4
                i += 1
                arg = f"{arg}={argv[i]}"
            overrides.append(arg)
        else:
            rest.append(arg)
        i += 1
    return rest, overrides


def _verb_options(parser: argparse.ArgumentParser, verb: str | None) -> frozenset[str]:
    """The option strings of ``verb``'s own parser (none for an unknown verb: argparse names it)."""
    for action in parser._actions:  # argparse keeps its sub-commands only here
        if isinstance(action, argparse._SubParsersAction) and verb in action.choices:
            return frozenset(action.choices[verb]._option_string_actions)
    return frozenset()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    verb = next((a for a in argv if not a.startswith("-")), None)  # after the global options (--debug)
    if verb == "experiment":  # its own options (--override=--training.x=…) pass untouched
        overrides: list[str] = []
        args = parser.parse_args(argv)
        args.command_line = shlex.join(["hyperplex", *argv])
    else:
        argv, overrides = _split_overrides(argv, _verb_options(parser, verb))
        args = parser.parse_args(argv)
    if hasattr(args, "overrides"):
        stray = [o for o in args.overrides if not o.startswith("--")]
        if stray:
            build_parser().error(f"unexpected argument {stray[0]!r} (overrides look like --section.key=value)")
        args.overrides = overrides
    elif overrides:
        build_parser().error(f"{args.command} takes no config overrides (got {overrides[0]})")
    debug = getattr(args, "debug", False)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print(f"hyperplex {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # noqa: BLE001
        from hyperplex.train.interrupts import TrainingInterrupted

        if not isinstance(err, TrainingInterrupted):
            return _report_error(args, err, debug)
        print(f"hyperplex {args.command}: {err}", file=sys.stderr)
        return 128 + err.signal_number  # the shell convention: 130 for SIGINT, 143 for SIGTERM
    finally:
        from hyperplex.train.process import shutdown_distributed

        shutdown_distributed()  # under torchrun; a no-op otherwise


def _report_error(args: argparse.Namespace, err: Exception, debug: bool) -> int:
    """The CLI's contract for errors: one line on stderr (the traceback only with --debug), exit 1."""
    if debug:
        raise err
    message = str(err) or type(err).__name__
    if isinstance(err, FileNotFoundError) and err.filename and str(err.filename) not in message:
        message = f"{message}: {err.filename}"
    known = isinstance(err, (ValueError, OSError, RuntimeError))
    suffix = "" if known else f" ({type(err).__name__}; run with --debug for the traceback)"
    print(f"hyperplex {args.command}: error: {message.splitlines()[0] if message else ''}{suffix}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
