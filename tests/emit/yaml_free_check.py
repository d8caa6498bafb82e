"""Minimal readers for the two formats the standard library cannot parse (the frameworks'
own readers are in test_emit_frameworks.py): Megatron argument lines and Bridge's YAML."""


def megatron_lines(text):
    """{flag: value or True} of a megatron.args file; every non-comment line is one flag."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        assert line.startswith("--"), line
        k, *v = line.split(maxsplit=1)
        out[k] = v[0] if v else True
    return out


def bridge_sections(text):
    """{section: {key: value text}} of the emitted YAML (two-level mapping)."""
    out, sec = {}, None
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        if not line.startswith(" "):
            k, _, v = line.partition(":")
            sec = out.setdefault(k, {}) if not v.strip() else None
            if v.strip():
                out[k] = v.strip()
        else:
            k, _, v = line.strip().partition(": ")
            sec[k] = v
    return out
