"""The profiler labels the lab writes into a call (`lab.run.instrument`) and reads back from its trace
(`lab.traces.timeline`): one place, so that the writer and the reader never disagree."""

#: one range per denoising step: `denoise_step_0`, `denoise_step_1`, ...
STEP_PREFIX = "denoise_step_"
#: a zero-length range where the pipeline opens its progress bar, right before the denoising loop: what the loop
#: runs before the first transformer call of step 0 (a scheduler's `scale_model_input`, a timestep's `.item()`)
#: belongs to step 0, not to the time before the loop
LOOP_BEGIN = "denoise_loop_begin"
