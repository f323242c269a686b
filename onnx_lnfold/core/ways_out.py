"""What a user can do about a refusal or an unverified check, worded per surface: the command line
spells options as flags, the API as keywords (`LnFoldError.said(surface)`). Each way out is worded
here once, for every step that raises it."""

from __future__ import annotations

# What the user can do when the check could not run, per surface.
WAY_OUT = {
    "cli": {
        "inputs": "give inputs with --inputs FILE.npz or shapes with --input-shape NAME:D1,D2,..., "
        "or accept an unverified model with --no-verify",
        "install": "pip install 'onnx_lnfold[ort]', or accept an unverified model with --no-verify",
        "decline": "accept an unverified model with --no-verify",
    },
    "api": {
        "inputs": "pass inputs={name: array} or input_shapes={name: shape}, or verify=False to accept an unverified model",
        "install": "pip install 'onnx_lnfold[ort]', or pass verify=False to accept an unverified model",
        "decline": "pass verify=False to accept an unverified model",
    },
}


# What the user can do about an input too large to synthesize (`feeds.budget`), per surface: check
# it at smaller sizes ({cli}: NAME:D1,D2,...; {api}: {'NAME': (D1, D2, ...)}), a size the graph
# fixes declared symbolic first ({symbolic}: "declare its dim 1 symbolic and "). The API's names
# the command line's spelling too: the same sizes are often tried there first.
_SHAPE_WAY_OUT = {
    "cli": "{symbolic}pass --input-shape {cli}, or accept an unverified model with --no-verify",
    "api": "{symbolic}pass input_shapes={api} (--input-shape {cli} on the command line), or verify=False to accept "
    "an unverified model",
}


def shape_way_out(surface: str, name: str, dims: tuple[int, ...], fixed_axes: tuple[int, ...] = ()) -> str:
    """The way out of `_SHAPE_WAY_OUT` for input `name` checked at `dims`, where the graph fixes
    `fixed_axes` at other sizes."""
    symbolic = ""
    if fixed_axes:
        words = " and ".join(map(str, fixed_axes))
        symbolic = f"declare its dim{'s' * (len(fixed_axes) > 1)} {words} symbolic and "
    cli, api = f"{name}:{','.join(map(str, dims))}", repr({name: tuple(dims)})
    return _SHAPE_WAY_OUT[surface].format(symbolic=symbolic, cli=cli, api=api)
