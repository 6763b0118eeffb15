"""A random chinese-roberta-wwm-ext-large stand-in in the HF folder layout the official code loads
(`AutoTokenizer` + `AutoModelForMaskedLM` from `GPT_SoVITS/pretrained_models/chinese-roberta-wwm-ext-large`).

The vocabulary is generated (special tokens, ASCII, the frontend's punctuation, CJK U+4E00..U+9FA5), so every
character of a normalised Mandarin text is one token, as with the real vocabulary; token ids differ from the
real model's, which does not matter for random weights.
"""

from __future__ import annotations

import json
from pathlib import Path

# hfl/chinese-roberta-wwm-ext-large config.json (BERT-large, 24 layers, hidden 1024, vocab 21128)
FULL_CONFIG = {
    "architectures": ["BertForMaskedLM"],
    "attention_probs_dropout_prob": 0.1,
    "bos_token_id": 0,
    "directionality": "bidi",
    "eos_token_id": 2,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "hidden_size": 1024,
    "initializer_range": 0.02,
    "intermediate_size": 4096,
    "layer_norm_eps": 1e-12,
    "max_position_embeddings": 512,
    "model_type": "bert",
    "num_attention_heads": 16,
    "num_hidden_layers": 24,
    "output_past": True,
    "pad_token_id": 0,
    "pooler_fc_size": 768,
    "pooler_num_attention_heads": 12,
    "pooler_num_fc_layers": 3,
    "pooler_size_per_head": 128,
    "pooler_type": "first_token_transform",
    "type_vocab_size": 2,
    "vocab_size": 21128,
}

TINY_DIMS = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2, "num_hidden_layers": 4}

_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
_EXTRA_MARKS = "!?…,.-，。？！、：；“”‘’（）《》【】—～·"


def make_vocab(size: int | None = None) -> list[str]:
    """Special tokens, printable ASCII, CJK marks and every character in U+4E00..U+9FA5; padded to ``size``."""
    vocab = list(_SPECIALS)
    seen = set(vocab)
    chars = [chr(c) for c in range(0x21, 0x7F)] + list(_EXTRA_MARKS) + [chr(c) for c in range(0x4E00, 0x9FA6)]
    for ch in chars:
        tok = ch.lower()
        if tok not in seen:
            seen.add(tok)
            vocab.append(tok)
    if size is not None:
        if len(vocab) > size:
            raise ValueError(f"vocabulary of {len(vocab)} tokens does not fit in {size}")
        vocab += [f"[unused{i}]" for i in range(size - len(vocab))]
    return vocab


def write_tokenizer_files(folder: str | Path, full_size: bool = False) -> Path:
    """Only the tokenizer part of the folder (vocab.txt, tokenizer.json, ...) and config.json: enough for G2PW."""
    from transformers import BertTokenizer

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    vocab = make_vocab(FULL_CONFIG["vocab_size"] if full_size else None)
    config = dict(FULL_CONFIG, vocab_size=len(vocab))
    if not full_size:
        config.update(TINY_DIMS)
    (folder / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    # from the folder's vocab.txt (transformers 5's BertTokenizerFast(vocab_file=...) ignores the file)
    tokenizer = BertTokenizer.from_pretrained(str(folder), do_lower_case=True)
    if len(tokenizer) != len(vocab):
        raise RuntimeError(f"the tokenizer read {len(tokenizer)} of the {len(vocab)} tokens of {folder / 'vocab.txt'}")
    tokenizer.save_pretrained(str(folder))
    return folder


def write_roberta_folder(folder: str | Path, full_size: bool = False, seed: int = 0) -> Path:
    """Write config.json, tokenizer files and random fp16 `pytorch_model.bin` weights; returns the folder."""
    import torch
    from transformers import BertConfig, BertForMaskedLM

    folder = write_tokenizer_files(folder, full_size)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))

    torch.manual_seed(seed)
    model = BertForMaskedLM(BertConfig(**config)).eval()
    with torch.no_grad():
        for p in model.parameters():  # LayerNorm weights/biases start constant; make every parameter matter
            if p.numel() > 1 and bool((p == p.flatten()[0]).all()):
                p.add_(0.1 * torch.randn_like(p))
    state = {k: v.half() for k, v in model.state_dict().items()}  # the published file stores fp16
    torch.save(state, folder / "pytorch_model.bin")
    return folder
