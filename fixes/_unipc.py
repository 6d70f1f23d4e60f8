"""Shared by the UniPC fixes: the two update functions they rewrite (a module starting with `_` is not a fix)."""

from lab.apply import Rewrite

MODULE = "diffusers.schedulers.scheduling_unipc_multistep"
UPDATES = ("UniPCMultistepScheduler.multistep_uni_p_bh_update", "UniPCMultistepScheduler.multistep_uni_c_bh_update")


def unipc_rewrite(codemod, upstream_since: str | None = None) -> Rewrite:
    """A rewrite of both UniPC update functions; only Wan's checkpoint uses UniPC among the scenarios."""
    return Rewrite(module=MODULE, targets=UPDATES, codemod=codemod, upstream_since=upstream_since, pipelines=("wan", "wan_v2v", "wan22"))


#: the predictor update as 0.37.1 has it: the examples of the UniPC fixes rewrite it
P_UPDATE_0371 = """
class S:
    def multistep_uni_p_bh_update(self, model_output, *args, sample=None, order=None, **kwargs):
        sigma_t, sigma_s0 = self.sigmas[self.step_index + 1], self.sigmas[self.step_index]
        alpha_t, sigma_t = self._sigma_to_alpha_sigma_t(sigma_t)
        h = lambda_t - lambda_s0
        device = sample.device

        rks = []
        for i in range(1, order):
            alpha_si, sigma_si = self._sigma_to_alpha_sigma_t(self.sigmas[si])
            rks.append(rk)

        rks.append(1.0)
        rks = torch.tensor(rks, device=device)
        b = []
        b = torch.tensor(b, device=device)
        if order == 2:
            rhos_p = torch.tensor([0.5], dtype=x.dtype, device=device)
        return x_t
"""
