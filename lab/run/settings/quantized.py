"""Quantization (`quantized:TYPE`): the denoiser's linear weights quantized with torchao, as a load with
`quantization_config=TorchAoConfig(...)` gives them, applied after the build through diffusers' own quantizer."""

from __future__ import annotations

from typing import Any

from lab.run.settings.kind import Kind, Undo, installed

#: `quantized:TYPE`: the torchao config each type names (the configs `TorchAoConfig` takes; diffusers 0.37.1's own
#: string names call torchao functions that torchao 0.18 no longer has)
QUANT_TYPES = {"int8wo": "Int8WeightOnlyConfig", "int8dq": "Int8DynamicActivationInt8WeightConfig",
               "float8wo": "Float8WeightOnlyConfig", "float8dq": "Float8DynamicActivationFloat8WeightConfig"}


def _quantized_device(options: dict, device: str) -> str | None:
    if options["type"] != "float8dq":
        return None
    import torch

    if not device.startswith("cuda") or torch.cuda.get_device_capability(torch.device(device)) < (8, 9):
        return "float8 dynamic quantization (float8 matmuls) needs a CUDA GPU of compute capability 8.9 or newer"
    return None


def _quantized_apply(built: Any, options: dict) -> Undo:
    """The denoiser as `from_pretrained(..., quantization_config=TorchAoConfig(config), torch_dtype=dtype)` gives it,
    through diffusers' own torchao quantizer: nothing kept in float32 (the torchao quantizer does not keep
    `_keep_in_fp32_modules`), then every `nn.Linear` weight quantized (`create_quantized_param`, as the load does
    per weight). The undo puts back the weights and dtypes it had; while quantized, the original weights wait on the
    host, so the device holds what a quantized load leaves on it."""
    import torch
    import torchao.quantization as tq
    from diffusers import TorchAoConfig
    from diffusers.quantizers import DiffusersAutoQuantizer

    from lab.run.dtypes import checkpoint_dtype

    model = getattr(built.pipe, built.scenario.denoiser)
    device = torch.device(built.device)
    attrs, config_attrs = dict(vars(model)), dict(vars(model.config))
    recast: list[tuple[torch.Tensor, torch.Tensor]] = []
    for prefix, module in model.named_modules():
        tensors = [*module._parameters.items(),
                   *((n, b) for n, b in module._buffers.items() if n not in module._non_persistent_buffers_set)]
        for name, tensor in tensors:
            full = f"{prefix}.{name}" if prefix else name
            if tensor is not None and tensor.dtype != built.dtype and torch.is_floating_point(tensor) \
                    and checkpoint_dtype(type(model), full, tensor, built.dtype) == torch.float32:
                recast.append((tensor, tensor.data))
                tensor.data = tensor.data.to(built.dtype)
    quantizer = DiffusersAutoQuantizer.from_config(TorchAoConfig(getattr(tq, QUANT_TYPES[options["type"]])()),
                                                   pre_quantized=False)
    quantizer.preprocess_model(model=model, device_map=None, keep_in_fp32_modules=[])
    originals: list[tuple[torch.nn.Module, str, torch.nn.Parameter]] = []
    for name, param in list(model.named_parameters()):
        if quantizer.check_if_quantized_param(model, param, name, {}, param_device=device):
            owner, _, attr = name.rpartition(".")
            originals.append((model.get_submodule(owner), attr, param))
            quantizer.create_quantized_param(model, param.detach(), name, device, {}, [])
            param.data = param.data.to("cpu")
    quantizer.postprocess_model(model)
    model.hf_quantizer = quantizer

    def undo() -> None:
        for module, attr, param in originals:
            param.data = param.data.to(device)
            module._parameters[attr] = param
        for tensor, data in recast:
            tensor.data = data
        for saved, now in ((attrs, vars(model)), (config_attrs, vars(model.config))):
            for key in set(now) - set(saved):
                del now[key]
            now.update(saved)

    return undo


KINDS = (
    Kind("quantized", "the denoiser's linear weights quantized with torchao, as a `TorchAoConfig` load gives them "
         "(int8 or float8, weight-only or with dynamic activations)",
         "from_pretrained(..., quantization_config=TorchAoConfig(...)), per weight after the build",
         options={"type": "int8wo"}, choices={"type": tuple(QUANT_TYPES)},
         host_check=installed("torchao", "torchao"), device_check=_quantized_device, apply=_quantized_apply,
         verify="both arms run the same quantized weights: outputs compared as without a setting"),
)
