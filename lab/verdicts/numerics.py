"""When two outputs that are not bit-identical still compute the same thing: each against a reference.

A change of kernel (an attention that takes no mask, a matmul on a contiguous input) or of the order of a reduction
rounds differently, so its output is not bit-identical to the control's, and a hand-set tolerance says nothing
about whether the difference is rounding. So both arms are held against a reference: the same weights and inputs
run in higher precision (float32 where the arms run bf16 or fp16 on a GPU, float64 otherwise), the control's code.
With `e_c` and `e_t` each arm's relative error against it (the L2 norm of the difference over the reference's):

- A change that only rounds differently leaves an error of the same size as the control's: both are rounding at
  the same precision, carried through the same loop, and the norm of such an error over an output's many elements
  varies little from one rounding to another. A change of what is computed adds a difference of its own, which at
  any size that matters is far larger than rounding. So the test arm is **numerically equivalent** when
  `e_t <= RATIO * max(e_c, floor)`, `floor` a few units of the reference's own rounding (so that a control that is
  the reference to the last bit does not make every other rounding a difference).
- The reference cannot tell when the control itself is far from it (`e_c > CEILING`: a chaotic loop, or random
  weights that amplify rounding): a change would not show against that error, so the outputs stay "differ".
- A NaN or an infinity never passes.

Bit-identical stays the stronger label; anything the rule does not accept is "outputs differ", with both errors.
"""

from __future__ import annotations

import dataclasses
import math

#: how much larger than the control's own error the test arm's may be and still be rounding
RATIO = 2.0
#: the control's relative error above which the reference cannot tell rounding from a change
CEILING = 0.1
#: the floor of the errors, in units of the reference dtype's machine epsilon
FLOOR_EPS = 8.0
EPSILON = {"float64": 2.220446049250313e-16, "float32": 1.1920928955078125e-07}

IDENTICAL = "bit-identical"
EQUIVALENT = "numerically equivalent"
DIFFER = "outputs differ"


@dataclasses.dataclass(frozen=True)
class Numerics:
    """Both arms against the reference, and what the rule made of them."""

    label: str
    reference: str  # "float64 on cpu"
    control_error: float
    test_error: float
    bound: float  # the largest test error the rule accepts
    reason: str

    @property
    def accepted(self) -> bool:
        return self.label == EQUIVALENT


def judge(control_error: float, test_error: float, reference_dtype: str, where: str = "") -> Numerics:
    """Apply the rule (the module's docstring) to the two arms' relative errors against the reference."""
    reference = f"{reference_dtype}{' on ' + where if where else ''}"
    floor = FLOOR_EPS * EPSILON.get(reference_dtype, EPSILON["float32"])
    bound = RATIO * max(control_error, floor) if math.isfinite(control_error) else math.nan
    if not (math.isfinite(control_error) and math.isfinite(test_error)):
        return Numerics(DIFFER, reference, control_error, test_error, bound, "an output holds NaN or infinity")
    if control_error > CEILING:
        return Numerics(DIFFER, reference, control_error, test_error, bound,
                        f"the control itself is {control_error:.3g} from the reference (over {CEILING:g}): a change "
                        "would not show against that, so the reference cannot tell")
    if test_error <= bound:
        return Numerics(EQUIVALENT, reference, control_error, test_error, bound,
                        f"the test arm's error {test_error:.3g} is within {RATIO:g}x the control's {control_error:.3g}:"
                        " rounding at the arms' precision")
    return Numerics(DIFFER, reference, control_error, test_error, bound,
                    f"the test arm's error {test_error:.3g} exceeds {RATIO:g}x the control's {control_error:.3g}: more "
                    "than rounding")
