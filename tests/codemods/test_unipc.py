"""Before/after source tests for the two UniPC rewrites (libcst CodemodTest style)."""

from libcst.codemod import CodemodTest

from fixes.unipc_device_const import DeviceHalf
from fixes.unipc_stack import StackRks

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

P_UPDATE_STACKED = """
class S:
    def multistep_uni_p_bh_update(self, model_output, *args, sample=None, order=None, **kwargs):
        device = sample.device
        sigma_t, sigma_s0 = self.sigmas[self.step_index + 1].to(device), self.sigmas[self.step_index].to(device)
        alpha_t, sigma_t = self._sigma_to_alpha_sigma_t(sigma_t)
        h = lambda_t - lambda_s0

        rks = []
        for i in range(1, order):
            alpha_si, sigma_si = self._sigma_to_alpha_sigma_t(self.sigmas[si].to(device))
            rks.append(rk)

        rks.append(torch.ones((), device=device))
        rks = torch.stack(rks)
        b = []
        b = torch.stack(b) if len(b) > 0 else torch.tensor(b, device=device)
        if order == 2:
            rhos_p = torch.tensor([0.5], dtype=x.dtype, device=device)
        return x_t
"""


class TestStackRks(CodemodTest):
    TRANSFORM = StackRks

    def test_rewritten(self) -> None:
        self.assertCodemod(P_UPDATE_0371, P_UPDATE_STACKED)

    def test_already_fixed_is_a_no_op(self) -> None:
        self.assertCodemod(P_UPDATE_STACKED, P_UPDATE_STACKED)

    def test_other_functions_untouched(self) -> None:
        before = P_UPDATE_0371.replace("multistep_uni_p_bh_update", "some_other_update")
        self.assertCodemod(before, before)

    def test_unexpected_shape_warns_and_changes_nothing(self) -> None:
        # rks built some other way: the site is not what the rewrite expects, so nothing is edited.
        before = P_UPDATE_0371.replace("rks = torch.tensor(rks, device=device)", "rks = make_rks(rks)")
        self.assertCodemod(
            before,
            before,
            expected_warnings=[
                "`multistep_uni_p_bh_update` does not have the expected shape (missing edits: rks_stack; "
                "unexpected: none); left unchanged."
            ],
        )


class TestDeviceHalf(CodemodTest):
    TRANSFORM = DeviceHalf

    def test_rewritten(self) -> None:
        after = P_UPDATE_0371.replace(
            "torch.tensor([0.5], dtype=x.dtype, device=device)", "torch.ones(1, dtype=x.dtype, device=device) * 0.5"
        )
        self.assertCodemod(P_UPDATE_0371, after)

    def test_no_op_when_fixed(self) -> None:
        fixed = P_UPDATE_0371.replace(
            "torch.tensor([0.5], dtype=x.dtype, device=device)", "torch.ones(1, dtype=x.dtype, device=device) * 0.5"
        )
        self.assertCodemod(fixed, fixed)

    def test_warns_without_the_constant(self) -> None:
        before = P_UPDATE_0371.replace("torch.tensor([0.5], dtype=x.dtype, device=device)", "half")
        self.assertCodemod(
            before,
            before,
            expected_warnings=[
                "`multistep_uni_p_bh_update` does not have the expected shape (missing edits: half; unexpected: none); "
                "left unchanged."
            ],
        )


from fixes.unipc_host_coeffs import HostCoefficients  # noqa: E402

C_UPDATE_0371 = """
class S:
    def multistep_uni_c_bh_update(self, this_model_output, *args, last_sample=None, this_sample=None, order=None):
        sigma_t, sigma_s0 = self.sigmas[self.step_index], self.sigmas[self.step_index - 1]
        device = this_sample.device
        rks.append(1.0)
        rks = torch.tensor(rks, device=device)
        b = torch.tensor(b, device=device)
        if order == 1:
            rhos_c = torch.tensor([0.5], dtype=x.dtype, device=device)
        else:
            rhos_c = torch.linalg.solve(R, b).to(device).to(x.dtype)
        corr_res = torch.einsum("k,bkc...->bc...", rhos_c[:-1], D1s)
        return x_t
"""
C_UPDATE_HOST = """
class S:
    def multistep_uni_c_bh_update(self, this_model_output, *args, last_sample=None, this_sample=None, order=None):
        sigma_t, sigma_s0 = self.sigmas[self.step_index], self.sigmas[self.step_index - 1]
        device = this_sample.device
        rks.append(torch.ones_like(h))
        rks = torch.stack(rks)
        b = torch.stack(b)
        if order == 1:
            rhos_c = torch.tensor([0.5], dtype=x.dtype)
        else:
            rhos_c = torch.linalg.solve(R, b).to(x.dtype)
        corr_res = sum(rho * D1s[:, k] for k, rho in enumerate(rhos_c[:-1].tolist()))
        return x_t
"""
C_UPDATE_0380 = """
class S:
    def multistep_uni_c_bh_update(self, this_model_output, *args, last_sample=None, this_sample=None, order=None):
        device = this_sample.device
        sigma_t, sigma_s0 = self.sigmas[self.step_index].to(device), self.sigmas[self.step_index - 1].to(device)
        rks.append(torch.ones((), device=device))
        rks = torch.stack(rks)
        b = torch.stack(b) if len(b) > 0 else torch.tensor(b, device=device)
        if order == 1:
            rhos_c = torch.ones(1, dtype=x.dtype, device=device) * 0.5
        else:
            rhos_c = torch.linalg.solve(R, b).to(device).to(x.dtype)
        corr_res = torch.einsum("k,bkc...->bc...", rhos_c[:-1], D1s)
        return x_t
"""
C_UPDATE_0380_HOST = """
class S:
    def multistep_uni_c_bh_update(self, this_model_output, *args, last_sample=None, this_sample=None, order=None):
        device = this_sample.device
        sigma_t, sigma_s0 = self.sigmas[self.step_index], self.sigmas[self.step_index - 1]
        rks.append(torch.ones_like(h))
        rks = torch.stack(rks)
        b = torch.stack(b)
        if order == 1:
            rhos_c = torch.ones(1, dtype=x.dtype) * 0.5
        else:
            rhos_c = torch.linalg.solve(R, b).to(x.dtype)
        corr_res = sum(rho * D1s[:, k] for k, rho in enumerate(rhos_c[:-1].tolist()))
        return x_t
"""


class TestHostCoefficients(CodemodTest):
    TRANSFORM = HostCoefficients

    def test_rewritten_0371_shape(self) -> None:
        self.assertCodemod(C_UPDATE_0371, C_UPDATE_HOST)

    def test_rewritten_0380_shape(self) -> None:
        self.assertCodemod(C_UPDATE_0380, C_UPDATE_0380_HOST)

    def test_no_op_when_fixed(self) -> None:
        self.assertCodemod(C_UPDATE_HOST, C_UPDATE_HOST)

    def test_warns_without_the_einsum(self) -> None:
        before = C_UPDATE_0371.replace('torch.einsum("k,bkc...->bc...", rhos_c[:-1], D1s)', "apply(rhos_c, D1s)")
        self.assertCodemod(
            before, before,
            expected_warnings=["`multistep_uni_c_bh_update` does not have the expected shape (missing edits: einsum; "
                               "unexpected: none); left unchanged."],
        )
