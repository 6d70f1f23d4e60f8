"""A LoRA (`pipe.load_lora_weights(...)`, fused with `pipe.fuse_lora()` on request): random weights on the
attention projections, made with PEFT and loaded as a user loads a trained one."""

from __future__ import annotations

from typing import Any

from lab.base.errors import UsageError
from lab.run.settings.kind import Kind, Range, Target, Undo, installed


def _lora_check(target: Target, options: dict) -> str | None:
    if not hasattr(target.pipeline_cls, "load_lora_weights"):
        return "the pipeline has no `load_lora_weights`"
    return None


#: attention projections a LoRA targets, as diffusers' training scripts name them
LORA_TARGETS = ("to_q", "to_k", "to_v", "to_out.0")


def _lora_apply(built: Any, options: dict) -> Undo:
    """A random LoRA of the given rank on the transformer's attention projections, loaded as a user loads one:
    `pipe.load_lora_weights(state_dict, adapter_name=...)` (PEFT), fused into the weights with `fused`."""
    import torch
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    pipe, component = built.pipe, built.scenario.denoiser  # `transformer`, or `unet` (SDXL)
    transformer = getattr(pipe, component)
    targets = sorted({name.rsplit(".", 1)[-1] if not name.endswith("to_out.0") else "to_out.0"
                      for name, m in transformer.named_modules()
                      if isinstance(m, torch.nn.Linear) and name.endswith(LORA_TARGETS)})
    if not targets:
        raise UsageError(f"`--setting lora`: the {component} of {type(pipe).__name__} has no attention projection "
                         f"named {', '.join(LORA_TARGETS)}.")
    # fusing adds B·A into the weights and unfusing subtracts it again, which does not give back the same bits: the
    # undo puts back a host copy of the projections' weights taken before
    saved = {name: m.weight.detach().to("cpu", copy=True) for name, m in transformer.named_modules()
             if isinstance(m, torch.nn.Linear) and name.endswith(LORA_TARGETS)} if options["fused"] else {}
    # PEFT freezes every base parameter and leaves them frozen when the adapter is unloaded, which picks another CPU
    # `linear` path (SDXL's outputs move): the undo gives the flags back, and drops what PEFT set on the model
    grads = [(p, p.requires_grad) for p in transformer.parameters()]
    attrs = dict(vars(transformer))
    # make the adapter's weights with PEFT on the transformer itself (random A and B: `init_lora_weights=False`),
    # take its state dict, and remove it again: what a trained LoRA file holds
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(options["seed"])
    transformer.add_adapter(LoraConfig(r=options["rank"], lora_alpha=options["rank"], target_modules=targets,
                                       init_lora_weights=False), adapter_name="lab_make")
    torch.random.set_rng_state(generator_state)
    state = {f"{component}.{k}": v.detach().to("cpu", torch.float32).clone()
             for k, v in get_peft_model_state_dict(transformer, adapter_name="lab_make").items()}
    transformer.delete_adapters("lab_make")
    pipe.load_lora_weights(state, adapter_name="lab")
    if options["fused"]:
        pipe.fuse_lora(components=[component], lora_scale=options["scale"])
    else:
        pipe.set_adapters(["lab"], adapter_weights=[options["scale"]])

    def undo() -> None:
        if options["fused"]:
            pipe.unfuse_lora(components=[component])
        pipe.unload_lora_weights()
        modules = dict(transformer.named_modules())
        with torch.no_grad():
            for name, weight in saved.items():
                modules[name].weight.copy_(weight)
        for param, flag in grads:
            param.requires_grad_(flag)
        for key in set(vars(transformer)) - set(attrs):
            del vars(transformer)[key]

    return undo


KINDS = (
    Kind("lora", "a random LoRA on the attention projections, loaded with the pipeline's `load_lora_weights` (PEFT)",
         "pipe.load_lora_weights(...); fused: pipe.fuse_lora()",
         options={"rank": 16, "scale": 1.0, "fused": False, "seed": 0}, check=_lora_check,
         ranges={"rank": Range(1, None, "the adapter's rank (`LoraConfig(r=...)`)"),
                 "seed": Range(0, 2**64 - 1, "`torch.manual_seed` takes it")},
         host_check=installed("peft", "PEFT"), apply=_lora_apply),
)
