"""Every tensor-producing node of the quantized exported graph has qparams, or its op is on
the case's allowlist with a reason. Unexplained float nodes fail, each with its source line; a
float value that only reaches explicit QUANTIZE ops (a float boundary) is counted, not failed."""

from collections import Counter

from harness.checks.base import Check, CheckResult, Metric, requires_capability


def run(pipeline) -> CheckResult:
    result = CheckResult()
    audit = pipeline.circle.audit
    allow = pipeline.case.qparam_allowlist
    unexplained = [n for n in audit.missing if n["target"] not in allow]
    result.metrics.update(
        {
            "quantized_nodes": audit.quantized_nodes,
            "float_nodes": audit.float_nodes,
            "integer_nodes": audit.integer_nodes,
            "missing_qparam": len(audit.missing),
            "missing_allowlisted": len(audit.missing) - len(unexplained),
            "missing_unexplained": len(unexplained),
            "float_boundary": len(audit.float_boundary),
        }
    )
    if audit.float_boundary:
        result.evidence["float_boundary"] = audit.float_boundary
        result.notes.append(
            f"{len(audit.float_boundary)} float value(s) quantized before any arithmetic reads them: "
            f"{', '.join(audit.float_boundary[:6])}"
        )
    result.evidence["missing"] = [dict(n, allowed_because=allow.get(n["target"])) for n in audit.missing]
    result.evidence["by_target"] = dict(Counter(n["target"] for n in audit.missing))
    if audit.quantized_nodes == 0:
        result.fail("the exported graph has no quantized node at all: quantization passes saw no qparams")
    present = {n["target"] for n in audit.missing}
    for target in allow:
        if target not in present:
            result.fail(f"qparam_allowlist entry {target!r} matches no node without qparam (stale allowlist)")
    for node in unexplained:
        where = " | ".join(node["source"]) or "no stack trace"
        result.fail(f"{node['role']} {node['name']} ({node['target']}, {node['users']} users) has no qparam: {where}")
    return result


CHECK = Check(
    name="qparam_audit",
    run=run,
    applies=requires_capability("export"),
    description=__doc__.splitlines()[0],
    metrics=(
        Metric("missing_qparam", label="no-qparam", headline=True),
        Metric("missing_unexplained", label="no-qparam, unexplained"),
        Metric("quantized_nodes", better=None, label="quantized nodes"),
        Metric("float_nodes", better=None, label="float nodes"),
        Metric("float_boundary", better=None, label="float values quantized before use"),
    ),
    report="""{% set m = rec.get("metrics") or {} %}{% if m %}<div>{{ m.get("quantized_nodes") }} quantized, {{
    m.get("float_nodes") }} float nodes;
  {{ m.get("missing_qparam") }} without qparam ({{ m.get("missing_allowlisted") }} allowlisted)</div>{% endif %}
{% for node in (rec.get("evidence") or {}).get("missing") or [] %}
<details class="qparam-node"><summary><code>{{ node.name }}</code> {{ node.target }} ({{ node.users }} users){%
if node.get("allowed_because") %} &mdash; allowed: {{ node.allowed_because }}{% endif %}</summary>
  <pre class="stack-trace">{{ node.stack_trace }}</pre></details>
{% endfor %}""",
)
