"""LTX-2: LTX2Pipeline at 512x768, 121 frames, guidance_scale 4.0 with a negative prompt (STG/modality pinned off)."""

import torch

from lab.run.scenario import Model, Scenario, randn

UPSTREAM = "diffusers-upstream.md section D.4"


def prompt_inputs(pipe, size, batch, device, dtype, generator):
    seq = 1024 if size != "tiny" else 16
    connectors = pipe.connectors.config
    dim = connectors.caption_channels * connectors.text_proj_in_factor
    # Gemma-3 hidden states of all 49 layers flattened ([B, 1024, 3840 x 49]), left-padded: the prompt's tokens
    # are the last ones, so the mask is 0 then 1.
    real = min(seq, 32)
    mask = torch.zeros((batch, seq), dtype=torch.int64)
    mask[:, seq - real :] = 1
    return {
        "prompt": None,
        "prompt_embeds": randn((batch, seq, dim), generator, device, dtype, 0.5),
        "prompt_attention_mask": mask.to(device),
        "negative_prompt_embeds": randn((batch, seq, dim), generator, device, dtype, 0.5),
        "negative_prompt_attention_mask": mask.to(device),
        "max_sequence_length": seq,
    }


SCENARIO = Scenario(
    name="ltx2",
    pipeline_cls="diffusers.LTX2Pipeline",
    checkpoint="Lightricks/LTX-2",
    description="LTX2Pipeline, 512x768, 121 frames, guidance_scale 4.0 + negative prompt, STG/modality off",
    call={"height": 512, "width": 768, "num_frames": 121, "frame_rate": 24.0, "guidance_scale": 4.0},
    tiny_call={"height": 32, "width": 32, "num_frames": 9, "frame_rate": 25.0},
    # 0.38+ adds STG and modality guidance (0.42.1 defaults run 3 transformer calls per step): pin them off so
    # calls compare across diffusers versions; passed only where the installed pipeline accepts them.
    pinned_if_supported={
        "stg_scale": 0.0, "modality_scale": 1.0, "guidance_rescale": 0.0, "audio_guidance_scale": 4.0,
        "audio_stg_scale": 0.0, "audio_modality_scale": 1.0, "audio_guidance_rescale": 0.0,
        "use_cross_timestep": False,
    },
    models={
        "transformer": Model(
            cls="diffusers.LTX2VideoTransformer3DModel",
            full={"rope_type": "split"},
            tiny={
                "in_channels": 4, "out_channels": 4, "patch_size": 1, "patch_size_t": 1, "num_attention_heads": 2,
                "attention_head_dim": 8, "cross_attention_dim": 16, "audio_in_channels": 4, "audio_out_channels": 4,
                "audio_num_attention_heads": 2, "audio_attention_head_dim": 4, "audio_cross_attention_dim": 8,
                "num_layers": 2, "qk_norm": "rms_norm_across_heads", "caption_channels": 16,
                "rope_double_precision": False, "rope_type": "split",
            },
            blocks=("num_layers",),
        ),
        "connectors": Model(
            cls="diffusers.pipelines.ltx2.connectors.LTX2TextConnectors",
            full={
                "caption_channels": 3840, "text_proj_in_factor": 49, "video_connector_num_attention_heads": 30,
                "video_connector_attention_head_dim": 128, "video_connector_num_layers": 2,
                "video_connector_num_learnable_registers": 128, "audio_connector_num_attention_heads": 30,
                "audio_connector_attention_head_dim": 128, "audio_connector_num_layers": 2,
                "audio_connector_num_learnable_registers": 128, "connector_rope_base_seq_len": 4096,
                "rope_theta": 10000.0, "rope_double_precision": True, "causal_temporal_positioning": False,
                "rope_type": "split",
            },
            tiny={
                "caption_channels": 16, "text_proj_in_factor": 3, "video_connector_num_attention_heads": 2,
                "video_connector_attention_head_dim": 8, "video_connector_num_layers": 1,
                "video_connector_num_learnable_registers": 8, "audio_connector_num_attention_heads": 2,
                "audio_connector_attention_head_dim": 8, "audio_connector_num_layers": 1,
                "audio_connector_num_learnable_registers": 8, "connector_rope_base_seq_len": 32,
                "rope_theta": 10000.0, "rope_double_precision": False, "causal_temporal_positioning": False,
                "rope_type": "split",
            },
        ),
        "vae": Model(
            cls="diffusers.AutoencoderKLLTX2Video",
            full={"decoder_causal": False, "timestep_conditioning": False, "spatial_compression_ratio": 32,
                  "temporal_compression_ratio": 8},
            tiny={
                "latent_channels": 4, "block_out_channels": [8], "decoder_block_out_channels": [8],
                "layers_per_block": [1], "decoder_layers_per_block": [1, 1], "spatio_temporal_scaling": [True],
                "decoder_spatio_temporal_scaling": [True], "decoder_inject_noise": [False, False],
                "downsample_type": ["spatial"], "upsample_residual": [False], "upsample_factor": [1],
                "timestep_conditioning": False, "patch_size": 1, "patch_size_t": 1, "encoder_causal": True,
                "decoder_causal": False,
            },
        ),
        "audio_vae": Model(
            cls="diffusers.AutoencoderKLLTX2Audio",
            full={},
            tiny={
                "base_channels": 4, "output_channels": 2, "ch_mult": [1], "num_res_blocks": 1, "in_channels": 2,
                "resolution": 32, "latent_channels": 2, "norm_type": "pixel", "causality_axis": "height",
                "mid_block_add_attention": False, "sample_rate": 16000, "mel_hop_length": 160, "is_causal": True,
                "mel_bins": 8,
            },
        ),
        "vocoder": Model(
            cls="diffusers.pipelines.ltx2.vocoder.LTX2Vocoder",
            full={},
            tiny={
                "in_channels": 16, "hidden_channels": 32, "out_channels": 2, "upsample_kernel_sizes": [4, 4],
                "upsample_factors": [2, 2], "resnet_kernel_sizes": [3], "resnet_dilations": [[1, 3, 5]],
                "output_sampling_rate": 16000,
            },
        ),
    },
    scheduler=(
        "diffusers.FlowMatchEulerDiscreteScheduler",
        {"use_dynamic_shifting": True, "base_shift": 0.95, "max_shift": 2.05, "base_image_seq_len": 1024,
         "max_image_seq_len": 4096, "shift_terminal": 0.1},
    ),
    prompt_inputs=prompt_inputs,
    sources={
        "transformer": f"{UPSTREAM}: class defaults + rope_type='split' (convert_ltx2_to_diffusers.py L299-347)",
        "connectors": f"{UPSTREAM}: converter L480-505 (all arguments required in 0.37.1)",
        "vae": f"{UPSTREAM}: converter '2.0' values, decoder_causal=False (timestep_conditioning uncertain)",
        "audio_vae/vocoder": f"{UPSTREAM}: class defaults",
        "scheduler": f"{UPSTREAM}: converter non-distilled branch L1631-1638 (not hub-verified)",
        "prompt_embeds": f"{UPSTREAM}: [B, 1024, 188160] + int64 mask, negative the same",
        "tiny": "diffusers-upstream.md section F (tests/pipelines/ltx2 get_dummy_components)",
    },
)
