"""Cosmos-Predict2 2B Text2Image: Cosmos2TextToImagePipeline at 768x1360, guidance 7.0 with a negative prompt.

The pipeline docstring example of nvidia/Cosmos-Predict2-2B-Text2Image: the call defaults (768x1360, guidance_scale
7.0, 35 steps) with the prompt and the negative prompt given; guidance > 1 makes two transformer calls per step (one
with the prompt, one with the negative prompt, not batched).

The safety checker. `Cosmos2TextToImagePipeline.__init__` replaces `safety_checker=None` by `CosmosSafetyChecker()`,
which without the `cosmos_guardrail` package is a stub whose constructor raises ImportError; and `__call__` raises
ValueError at once if `self.safety_checker` is None (set after construction), so the pipeline cannot run without a
checker object. The real one (cosmos-guardrail 0.3.2, `CosmosSafetyChecker`) downloads nvidia/Cosmos-1.0-Guardrail
(blocklist, RetinaFace) and Qwen/Qwen3Guard-Gen-0.6B from the hub in its constructor, which cannot be done here. What
the pipeline does with it (diffusers 0.37.1, pipeline_cosmos2_text2image.py L182-183, L495-500, L516-526, L639-664):
  - at every call: `safety_checker.to(device)`, then `check_text_safety(p)` for each prompt string *only when
    `prompt` is given* (the lab passes prompt embeddings and prompt=None, so never), then `safety_checker.to("cpu")`;
  - after decoding, only when output_type != "latent": the frames go to uint8 numpy, through `check_video_safety`
    (RetinaFace face blur), and back; with output_type="latent" (the lab's default) nothing of it runs.
So at the lab's call the real checker does no checking at all; its only cost is the two `.to()` calls, which with
the real guardrail move its models (Qwen3Guard 0.6B, RetinaFace) to the GPU and back to the host at every call: a
cost of a real user's run that this scenario does NOT reproduce. The stand-in below is diffusers' own test stand-in
(tests/pipelines/cosmos/cosmos_guardrail.py `DummyCosmosSafetyChecker`): a module without weights whose text check
passes and whose video check returns the frames unchanged, so the pipeline's own code paths (the `.to()` calls, and
at full decode the numpy round trip) run as with the real checker. The diffusers converter
(scripts/convert_cosmos_to_diffusers.py L798) saves the pipeline with `safety_checker=lambda *a, **k: None`, which
only serves saving: `__call__` would fail on its `.to()`.

torchvision: `CosmosTransformer3DModel.forward` with concat_padding_mask=True (the checkpoint's) resizes the padding
mask with `torchvision.transforms.functional.resize`, so the transformer needs torchvision installed; without it the
first forward fails with NameError `transforms`.
"""

import numpy as np
import torch

from diffusers.configuration_utils import ConfigMixin
from diffusers.models.modeling_utils import ModelMixin
from lab.run.scenario import Model, Scenario, randn

DIFFUSERS = "https://github.com/huggingface/diffusers/blob/58eb52c0803ea9af3abec60841c2a093bdf1f951"
CONVERTER = f"{DIFFUSERS}/scripts/convert_cosmos_to_diffusers.py"
PIPELINE = "diffusers 0.37.1 pipelines/cosmos/pipeline_cosmos2_text2image.py"
TEST = f"{DIFFUSERS}/tests/pipelines/cosmos/test_cosmos2_text2image.py"

#: real T5 tokens (with </s>) of the docstring's prompt (98 words) and negative prompt (73 words): estimates from the
#: word counts (the t5-11b tokenizer cannot be loaded here); past them `_get_t5_prompt_embeds` zeroes the embeddings
PROMPT_TOKENS, NEGATIVE_TOKENS = 130, 110


class PassThroughSafetyChecker(ModelMixin, ConfigMixin):
    """diffusers' `DummyCosmosSafetyChecker` (tests/pipelines/cosmos/cosmos_guardrail.py): no weights, text always
    safe, frames returned unchanged; `.to()`, `device` and `dtype` as a module's."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("_device_tracker", torch.zeros(1, dtype=torch.float32), persistent=False)

    def check_text_safety(self, prompt: str) -> bool:
        return True

    def check_video_safety(self, frames: np.ndarray) -> np.ndarray:
        return frames

    def to(self, device: str | torch.device = None, dtype: torch.dtype = None):
        return super().to(device=device, dtype=dtype)

    @property
    def device(self) -> torch.device:
        return self._device_tracker.device

    @property
    def dtype(self) -> torch.dtype:
        return self._device_tracker.dtype


def _t5_embeds(batch, seq, dim, real, generator, device, dtype):
    embeds = randn((batch, seq, dim), generator, device, dtype, 0.5)
    embeds[:, min(real, seq):] = 0  # as `_get_t5_prompt_embeds` zeroes the padding positions
    return embeds


def prompt_inputs(pipe, size, batch, device, dtype, generator):
    seq = 512 if size != "tiny" else 16
    dim = pipe.transformer.config.text_embed_dim
    # T5-11B last_hidden_state padded to max_sequence_length 512; guidance 7.0 needs the negative prompt's too.
    return {
        "prompt": None,
        "prompt_embeds": _t5_embeds(batch, seq, dim, PROMPT_TOKENS, generator, device, dtype),
        "negative_prompt_embeds": _t5_embeds(batch, seq, dim, NEGATIVE_TOKENS, generator, device, dtype),
        "max_sequence_length": seq,
    }


SCENARIO = Scenario(
    name="cosmos2",
    pipeline_cls="diffusers.Cosmos2TextToImagePipeline",
    checkpoint="nvidia/Cosmos-Predict2-2B-Text2Image",
    description="Cosmos2TextToImagePipeline (Predict2 2B), 768x1360, guidance_scale 7.0 + negative prompt",
    call={"height": 768, "width": 1360, "guidance_scale": 7.0},
    tiny_call={"height": 32, "width": 32},
    models={
        "transformer": Model(
            cls="diffusers.CosmosTransformer3DModel",
            full={
                "in_channels": 16, "out_channels": 16, "num_attention_heads": 16, "attention_head_dim": 128,
                "num_layers": 28, "mlp_ratio": 4.0, "text_embed_dim": 1024, "adaln_lora_dim": 256,
                "max_size": [128, 240, 240], "patch_size": [1, 2, 2], "rope_scale": [1.0, 4.0, 4.0],
                "concat_padding_mask": True, "extra_pos_embed_type": None,
            },
            tiny={
                "in_channels": 16, "out_channels": 16, "num_attention_heads": 2, "attention_head_dim": 16,
                "num_layers": 2, "mlp_ratio": 2, "text_embed_dim": 32, "adaln_lora_dim": 4, "max_size": [4, 32, 32],
                "patch_size": [1, 2, 2], "rope_scale": [2.0, 1.0, 1.0], "concat_padding_mask": True,
                "extra_pos_embed_type": "learnable",
            },
            blocks=("num_layers",),
        ),
        "vae": Model(
            cls="diffusers.AutoencoderKLWan",
            full={},  # the Wan2.1 VAE (Wan-AI/Wan2.1-T2V-1.3B-Diffusers vae): AutoencoderKLWan() defaults
            tiny={"base_dim": 3, "z_dim": 16, "dim_mult": [1, 1, 1, 1], "num_res_blocks": 1,
                  "temperal_downsample": [False, True, True]},
            # the docstring loads the whole pipeline in bf16 (the converter saved the VAE in fp32, which
            # from_pretrained(torch_dtype=bf16) loads in bf16), so the scenario dtype, not Wan's fp32
        ),
    },
    # the pipeline's __init__ adds sigma_max=80, sigma_min=0.002, sigma_data=1.0, final_sigmas_type="sigma_min" to
    # the scheduler's config (L198-208), as the saved scheduler_config.json holds them; they are not __init__ args
    scheduler=("diffusers.FlowMatchEulerDiscreteScheduler", {"use_karras_sigmas": True}),
    prompt_inputs=prompt_inputs,
    pipeline_kwargs={"safety_checker": PassThroughSafetyChecker()},
    sources={
        "transformer": f"{CONVERTER} L336-349 TRANSFORMER_CONFIGS['Cosmos-2.0-Diffusion-2B-Text2Image']",
        "vae": f"{CONVERTER} L946-950: AutoencoderKLWan.from_pretrained('Wan-AI/Wan2.1-T2V-1.3B-Diffusers', "
               "subfolder='vae') for Cosmos 2.0 (its config = AutoencoderKLWan defaults, as in scenarios/wan.py)",
        "scheduler": f"{CONVERTER} L789 FlowMatchEulerDiscreteScheduler(use_karras_sigmas=True) + {PIPELINE} "
                     "L198-208 (sigma_max 80, sigma_min 0.002, sigma_data 1.0, final sigma = sigma_min); the hub "
                     "scheduler_config.json itself not seen",
        "call": f"{PIPELINE} EXAMPLE_DOC_STRING (prompt + negative prompt, defaults) and __call__ defaults "
                "L423-436 (768x1360, guidance_scale 7.0, 35 steps, max_sequence_length 512)",
        "prompt_embeds": f"{PIPELINE} _get_t5_prompt_embeds: T5-11B (d_model 1024) [B, 512, 1024], zero past the "
                         "real tokens (about 130 / 110: estimates), negative the same shape",
        "safety_checker": f"{DIFFUSERS}/tests/pipelines/cosmos/cosmos_guardrail.py DummyCosmosSafetyChecker; "
                          "cosmos-guardrail 0.3.2 (PyPI) cosmos_guardrail.py CosmosSafetyChecker",
        "tiny": f"{TEST} get_dummy_components / get_dummy_inputs (32x32, max_sequence_length 16)",
    },
)
