"""Leaving `applied(...)`, normally or by exception, puts back exactly the original objects."""

import importlib
import inspect

import pytest

from lab.apply.fix import applied, catalog
from lab.run.scenario import build, get_scenario


def snapshot(fix, pipe):
    """Every attribute a fix can touch: module and class dicts of its rewrite targets, the pipe and its scheduler."""
    state = {}
    for r in fix.rewrites:
        try:
            module = importlib.import_module(r.module)
        except ImportError:
            continue
        state[r.module] = dict(vars(module))
        for target in r.targets:
            owner = getattr(module, target.split(".")[0], None)
            if isinstance(owner, type):
                state[f"{r.module}:{owner.__name__}"] = dict(vars(owner))
                method = vars(owner).get(target.split(".")[1])
                if method is not None:
                    func = getattr(method, "__func__", method)
                    state[f"sig:{target}"] = inspect.signature(func)
    state["pipe"] = dict(vars(pipe))
    state["scheduler_cls"] = dict(vars(type(pipe.scheduler)))
    from accelerate.hooks import CpuOffload  # a runtime patch of accelerate's hook (`model_offload_keep_host`)

    state["accelerate:CpuOffload"] = dict(vars(CpuOffload))
    return state


def same(before, after):
    assert before.keys() == after.keys()
    for key in before:
        if key.startswith("sig:"):
            assert before[key] == after[key], key
        else:
            assert before[key].keys() == after[key].keys(), key
            for name, value in before[key].items():
                if key == "pipe" and not callable(value) and not hasattr(value, "config"):
                    # per-call state the pipeline itself resets on every call (`_guidance_scale`, ...): by value
                    assert after[key][name] == value, f"{key}.{name} was not restored"
                    continue
                assert after[key][name] is value, f"{key}.{name} was not restored"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(catalog()))
def test_restored_after_normal_exit_and_exception(name):
    fix = catalog()[name]
    built = build(get_scenario(fix.tried_on), size="tiny", device="cpu")  # its first pipeline, or the one it names
    built()  # a call sets the pipeline's own per-call attributes; snapshot after it
    before = snapshot(fix, built.pipe)
    with applied([fix], built.pipe):
        built()
    same(before, snapshot(fix, built.pipe))
    with pytest.raises(RuntimeError, match="boom"):
        with applied([fix], built.pipe):
            raise RuntimeError("boom")
    same(before, snapshot(fix, built.pipe))


def test_every_fix_is_tried_on_a_scenario():
    """A fix is tried on its first pipeline, unless it names one (`Fix(tried_on=...)`): a fix of every pipeline must."""
    from lab.run.definition import catalog as scenarios

    for name, fix in catalog().items():
        assert fix.tried_on is not None, f"`fixes/{name}.py` applies to every pipeline: name one, `tried_on=...`"
        assert fix.tried_on in scenarios(), f"`fixes/{name}.py` is tried on `{fix.tried_on}`, not a scenario"
