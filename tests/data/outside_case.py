import torch

from harness import Built, Case, CaseInputs, Sample


def build_linear(profile):
    module = torch.nn.Linear(16, 8)  # the harness seeds every RNG with Case.seed first
    sample = lambda: Sample(args=(torch.randn(2, 4, 16),))
    return Built(module=module, inputs=CaseInputs(calibration=(sample(), sample()), evaluation={"default": sample()}))


CASES = [
    Case(
        name="outside_linear",
        family="nn",
        build=build_linear,
        seed=0,
        expected_wrapper="QuantLinear",
        settings={"quant_accuracy": {"max_mean_abs_diff": 0.05, "max_peir": 0.1}},
    ),
]
