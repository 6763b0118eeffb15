"""Chinese BERT features (chinese-roberta-wwm-ext-large): one vector per character of the normalised Mandarin
text from the third-to-last hidden state, repeated per phone (official
`GPT_SoVITS/TTS_infer_pack/TextPreprocessor.py`, `TextPreprocessor.get_bert_feature`)."""

from __future__ import annotations

import pickle
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

import torch

from engine.errors import CheckpointError, TextError

HIDDEN_LAYER = -3  # hidden_states[-3]: output of encoder layer 22 of 24 in the large model
MAX_CHARS = 510  # 512 positions minus [CLS] and [SEP]
BATCH_TEXTS = 64  # most texts of concurrent requests run through BERT as one batch (accelerators)


def expand_to_phones(char_features: torch.Tensor, word2ph: Sequence[int]) -> torch.Tensor:
    """(n_chars, hidden) -> (hidden, n_phones): row i repeated word2ph[i] times."""
    if char_features.shape[0] != len(word2ph):
        raise TextError(f"{char_features.shape[0]} BERT tokens for {len(word2ph)} characters")
    counts = torch.as_tensor(list(word2ph), dtype=torch.long, device=char_features.device)
    return torch.repeat_interleave(char_features, counts, dim=0).T  # (hidden, n_phones)


class BertFeatureExtractor:
    """Wraps a HF masked-LM BERT and its tokenizer; the model's device and dtype are used as they are.

    On an accelerator, concurrent calls (many requests' sentences) run as one padded batch
    (:class:`engine.batching.GroupRunner`; padded positions are masked out, so each text's features are the
    same function of its own tokens). On the CPU each text runs alone, bit-exactly as the official code."""

    def __init__(self, model: torch.nn.Module, tokenizer, batched: bool | None = None):
        from engine.batching import GroupRunner

        self.model = model.eval()
        self.tokenizer = tokenizer
        p = next(self.model.parameters(), None)
        if batched is None:
            batched = p is not None and p.device.type != "cpu"
        # batches run on one thread of the extractor's own: one set of cuBLAS handles however many callers
        self._group = (GroupRunner(self._batch_features, max_batch=BATCH_TEXTS,
                                   executor=ThreadPoolExecutor(1, thread_name_prefix="bert"))
                       if batched else None)

    @classmethod
    def from_folder(cls, folder: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
        """Load chinese-roberta-wwm-ext-large (or any BERT in the same HF folder layout) with transformers."""
        from transformers import AutoModelForMaskedLM, AutoTokenizer

        folder = Path(folder)
        if not (folder / "config.json").is_file():
            raise CheckpointError(
                f"{folder} is not a BERT folder (no config.json): point it at chinese-roberta-wwm-ext-large "
                "(GPT_SoVITS/pretrained_models/chinese-roberta-wwm-ext-large in the official layout)"
            )
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
            # an explicit dtype: transformers 5 would otherwise keep the file's own (fp16 for the official folder)
            model = AutoModelForMaskedLM.from_pretrained(str(folder), local_files_only=True, dtype=dtype)
        except (OSError, ValueError, RuntimeError, pickle.UnpicklingError, EOFError) as e:
            raise CheckpointError(f"cannot load the BERT model from {folder}: {e}") from e
        return cls(model.to(device=device), tokenizer)

    @property
    def hidden_size(self) -> int:
        return int(self.model.config.hidden_size)

    def zeros(self, n_phones: int) -> torch.Tensor:
        """Features for non-Mandarin segments: zeros (hidden, n_phones) float32."""
        p = next(self.model.parameters())
        return torch.zeros((self.hidden_size, n_phones), dtype=torch.float32, device=p.device)

    @torch.inference_mode()
    def char_features(self, norm_text: str) -> torch.Tensor:
        """(n_chars, hidden) float32: hidden_states[-3] without [CLS] / [SEP].

        A text longer than 510 characters (where the official code fails on BERT's 512 positions) is read in
        consecutive 510-character windows."""
        if len(norm_text) > MAX_CHARS:
            parts = [self.char_features(norm_text[i : i + MAX_CHARS]) for i in range(0, len(norm_text), MAX_CHARS)]
            return torch.cat(parts, dim=0)
        if self._group is not None:
            return self._group(norm_text)
        device = next(self.model.parameters()).device
        inputs = self.tokenizer(norm_text, return_tensors="pt")
        inputs = {k: v.to(device) for k, v in inputs.items()}
        out = self.model(**inputs, output_hidden_states=True)
        return _checked(out.hidden_states[HIDDEN_LAYER][0, 1:-1].float(), norm_text)  # (n_chars, hidden)

    @torch.inference_mode()
    def _batch_features(self, texts: Sequence[str]) -> list[torch.Tensor]:
        """:meth:`char_features` of several texts (each <= MAX_CHARS) in one right-padded, masked batch."""
        device = next(self.model.parameters()).device
        inputs = self.tokenizer(list(texts), return_tensors="pt", padding=True)
        inputs = {k: v.to(device) for k, v in inputs.items()}
        hidden = self.model(**inputs, output_hidden_states=True).hidden_states[HIDDEN_LAYER]  # (B, T, hidden)
        lengths = inputs["attention_mask"].sum(dim=1).tolist()
        return [_checked(hidden[i, 1 : int(n) - 1].float(), text) for i, (n, text) in enumerate(zip(lengths, texts))]

    @property
    def batches(self) -> tuple[int, int]:
        """(batches, texts) run through the batched path so far (0, 0 when each text runs alone)."""
        return (self._group.batches, self._group.items) if self._group is not None else (0, 0)

    def __call__(self, norm_text: str, word2ph: Sequence[int]) -> torch.Tensor:
        """(hidden, n_phones) float32 features of a normalised Mandarin text."""
        if len(word2ph) != len(norm_text):
            raise TextError(f"word2ph has {len(word2ph)} entries for {len(norm_text)} characters")
        return expand_to_phones(self.char_features(norm_text), word2ph)


def _checked(feats: torch.Tensor, norm_text: str) -> torch.Tensor:
    if feats.shape[0] != len(norm_text):
        raise TextError(
            f"the BERT tokenizer made {feats.shape[0]} tokens of {len(norm_text)} characters; Mandarin "
            "features need one token per character (is this the chinese-roberta-wwm-ext-large tokenizer?)"
        )
    return feats
