"""Limits for profile 'real_weights_full' (the whole SmolLM2-135M-Instruct, nightly only), proposed by
`python -m harness limits --profile real_weights_full` from two clean runs of
`-k "quant_accuracy or lm_quality"` on the 2-core AVX-512 machine, 2026-12-02: native kernels and
ATEN_CPU_CAPABILITY=default (scalar). Reviewed: the default uint8 model collapses (top-1 agreement 0.007 on the
evaluation text), so its limits only catch a change in the size of the collapse (a tracked series on the
dashboard); the W8A16 model's limits are the gate that means something."""

LIMITS = {
    "llama_for_causal_lm_real_30l": ({"lm_quality": {"max_ppl_ratio": 90000, "min_top1_agreement": 0, "max_kl_divergence": 15}, "quant_accuracy": {"max_peir": 0.76, "max_mean_abs_diff": 9, "max_abs_diff": 51, "min_sqnr_db": 0}},
        "measured on clean tico, real_weights_full, worst over 2 kernel selection(s) (full-nat, full-def): ppl_ratio 7.122e+04, top1_agreement 0, kl_divergence 11.23, peir 0.6079, mean_abs_diff 7.192, max_abs_diff 40.36, sqnr_db 1.571; limits 1.25x the worst (dB metrics 1.5 dB below it; never below a metric's floor: one flip for Circle steps, 0.1 for mean steps)"),
    "llama_for_causal_lm_w8a16_real_30l": ({"lm_quality": {"max_ppl_ratio": 1.4, "min_top1_agreement": 0.6, "max_kl_divergence": 0.066}, "quant_accuracy": {"max_peir": 0.21, "max_mean_abs_diff": 0.82, "max_abs_diff": 15, "min_sqnr_db": 20.3}},
        "measured on clean tico, real_weights_full, worst over 2 kernel selection(s) (full-nat, full-def): ppl_ratio 1.06, top1_agreement 0.873, kl_divergence 0.05214, peir 0.1662, mean_abs_diff 0.648, max_abs_diff 11.75, sqnr_db 21.85; limits 1.25x the worst (dB metrics 1.5 dB below it; never below a metric's floor: one flip for Circle steps, 0.1 for mean steps)"),
}
