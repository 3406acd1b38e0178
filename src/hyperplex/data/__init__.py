"""Data loading: readers with precise errors, vocabularies, tokenisers, batching and datasets.

The generated arithmetic task (``hyperplex.data.arithmetic``) and pretrained embeddings (``hyperplex.data.glove``)
live in their own modules and are imported from there.
"""

from hyperplex.data.batching import BATCH_TYPES, make_batches, pad_sequences
from hyperplex.data.datasets import Batch, ClassificationDataset, JointPairDataset, PairDataset, Seq2SeqDataset
from hyperplex.data.readers import (
                                    AGREEMENT_LABELS,
                                    DataError,
                                    DataFileNotFoundError,
                                    DropReport,
                                    check_labels,
                                    filter_examples,
                                    read_agreement,
                                    read_jsonl,
                                    read_lines,
                                    read_parallel,
                                    read_tsv,
)
from hyperplex.data.tokenizers import (
                                    TOKENIZERS,
                                    CharTokenizer,
                                    SentencePieceTokenizer,
                                    Tokenizer,
                                    WordTokenizer,
                                    build_tokenizer,
                                    load_tokenizer,
)
from hyperplex.data.vocab import BOS_INDEX, EOS_INDEX, PAD_INDEX, SPECIALS, UNK_INDEX, Vocabulary

__all__ = [
    "AGREEMENT_LABELS", "BATCH_TYPES", "BOS_INDEX", "Batch", "CharTokenizer", "ClassificationDataset", "DataError",
    "DataFileNotFoundError", "DropReport", "EOS_INDEX", "JointPairDataset", "PAD_INDEX", "PairDataset", "SPECIALS",
    "Seq2SeqDataset", "SentencePieceTokenizer", "TOKENIZERS", "Tokenizer", "UNK_INDEX", "Vocabulary", "WordTokenizer",
    "build_tokenizer", "check_labels", "filter_examples", "load_tokenizer", "make_batches", "pad_sequences",
    "read_agreement", "read_jsonl", "read_lines", "read_parallel", "read_tsv",
]
