"""Builds and calls a project's tiny test pipelines in one copy under test, for `lab upstream check
--test-pipelines`; the lab never imports it: it is copied beside the run as `lab_pipeline_probe.py` and run as
`python lab_pipeline_probe.py SPEC OUT` in the checkout, so that the run imports nothing of the lab.

SPEC is a JSON list of `{"label", "file", "cls"}` (a test file of the checkout's `tests/pipelines/` and the class of
it that defines `get_dummy_components()`). For each, the class's `get_dummy_components()` are built into its
`pipeline_class`, moved to CUDA where torch finds it (else the CPU), and called with its `get_dummy_inputs()`; the
call's first output is saved as `OUT/<n>.npy` and a JSON line written to `OUT/results.jsonl` as each one ends:
`status` (`ok` or `error`, with `reason`, the error's last line), `device`, `stand_ins` and `output`.

With `HF_HUB_OFFLINE=1`, what the components load by name from the Hub and cannot is replaced by a stand-in, the
same in both copies and recorded in `stand_ins`: a tokenizer by a word-level one whose every word is its unknown
token (id 1); `hf-internal-testing/tiny-random-t5` (the text encoder of most video and FLUX test pipelines) by a T5
of that checkpoint's sizes with weights drawn from the seeded generator, as the test's own construction draws the
rest. The package under test must be the copy's (`$LAB_CHECK_SITE`): another is an error, since its outputs would be
another copy's.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import sys
import traceback
from pathlib import Path

STAND_INS: list[str] = []


def _stand_in_tokenizer(name: str):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<unk>": 1, "<s>": 2, "</s>": 3}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    STAND_INS.append(f"tokenizer {name}: a word-level stand-in (the Hub cannot be reached)")
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", unk_token="<unk>",
                                   bos_token="<s>", eos_token="</s>", model_max_length=512)


#: the sizes of the tiny checkpoints that test pipelines load by name (their config.json on the Hub)
TINY_CONFIGS = {
    "hf-internal-testing/tiny-random-t5": {
        "d_model": 32, "d_ff": 37, "d_kv": 8, "num_heads": 4, "num_layers": 5, "num_decoder_layers": 5,
        "vocab_size": 1103, "relative_attention_num_buckets": 8, "dropout_rate": 0.1, "feed_forward_proj": "relu",
        "pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0,
    },
}


def _stand_in_config(name: str):
    from transformers import T5Config

    STAND_INS.append(f"{name}: a T5 of its sizes, weights drawn from the seeded generator (the Hub cannot be reached)")
    return T5Config(**TINY_CONFIGS[name])


def _offline_stand_ins() -> None:
    """Where the Hub cannot be reached, a tokenizer or a tiny checkpoint loaded by name that is not cached becomes a
    stand-in (the module docstring)."""
    if os.environ.get("HF_HUB_OFFLINE") != "1":
        return
    try:
        import transformers
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
    except ImportError:
        return

    def tokenizer(original):
        def from_pretrained(cls, name, *args, **kwargs):
            try:
                return original.__func__(cls, name, *args, **kwargs)
            except OSError:
                return _stand_in_tokenizer(str(name))

        return classmethod(from_pretrained)

    def config(original):
        def from_pretrained(cls, name, *args, **kwargs):
            try:
                return original.__func__(cls, name, *args, **kwargs)
            except OSError:
                if str(name) not in TINY_CONFIGS:
                    raise
                return _stand_in_config(str(name))

        return classmethod(from_pretrained)

    def model(original):
        def from_pretrained(cls, name, *args, **kwargs):
            try:
                return original.__func__(cls, name, *args, **kwargs)
            except OSError:
                if str(name) not in TINY_CONFIGS:
                    raise
                return cls(_stand_in_config(str(name))).eval()

        return classmethod(from_pretrained)

    PreTrainedTokenizerBase.from_pretrained = tokenizer(PreTrainedTokenizerBase.from_pretrained)
    transformers.AutoTokenizer.from_pretrained = tokenizer(transformers.AutoTokenizer.from_pretrained)
    transformers.AutoConfig.from_pretrained = config(transformers.AutoConfig.from_pretrained)
    transformers.PreTrainedModel.from_pretrained = model(transformers.PreTrainedModel.from_pretrained)


def _array(output):
    import numpy as np
    import torch

    first = output[0] if isinstance(output, (tuple, list)) or hasattr(output, "to_tuple") else output
    if isinstance(first, torch.Tensor):
        return first.detach().float().cpu().numpy() if first.dtype == torch.bfloat16 else first.detach().cpu().numpy()
    if isinstance(first, list):
        return np.stack([_array([item]) for item in first])
    return np.asarray(first)


def _one(entry: dict, device: str, index: int, out: Path) -> dict:
    import numpy as np
    import torch

    module = importlib.import_module(entry["file"].removesuffix(".py").replace("/", "."))
    test = getattr(module, entry["cls"])()
    components = test.get_dummy_components()
    pipe = test.pipeline_class(**components)
    pipe.to(device)
    pipe.set_progress_bar_config(disable=True)
    parameters = inspect.signature(test.get_dummy_inputs).parameters
    inputs = test.get_dummy_inputs(device) if "device" in parameters else test.get_dummy_inputs()
    torch.manual_seed(0)
    with torch.no_grad():
        output = _array(pipe(**inputs))
    path = out / f"{index}.npy"
    np.save(path, output)
    return {"status": "ok", "output": str(path), "shape": list(output.shape)}


def main(spec: Path, out: Path) -> int:
    entries = json.loads(spec.read_text())
    sys.path.insert(0, os.getcwd())  # the checkout: its `tests` package
    site = Path(os.environ["LAB_CHECK_SITE"]).resolve()
    name = os.environ.get("LAB_CHECK_PACKAGE", "diffusers")
    package = importlib.import_module(name)
    if not Path(package.__file__).resolve().is_relative_to(site):
        print(f"the run imports {name} from {package.__file__}, not from the copy under test in {site}",
              file=sys.stderr)
        return 3
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    _offline_stand_ins()
    with open(out / "results.jsonl", "a", encoding="utf-8") as results:
        for index, entry in enumerate(entries):
            STAND_INS.clear()
            try:
                record = _one(entry, device, index, out)
            except Exception as e:  # noqa: BLE001 - one pipeline that cannot be built or called: the others still run
                last = traceback.format_exception_only(type(e), e)[-1].strip()
                record = {"status": "error", "reason": last[:500]}
            record.update(label=entry["label"], device=device, stand_ins=list(STAND_INS))
            results.write(json.dumps(record) + "\n")
            results.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
