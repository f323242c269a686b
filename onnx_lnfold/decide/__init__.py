"""Decide: what each folded LN becomes, and whether its fold pays. The op it is rewritten to and
where its beta goes (`targets`: `choose_rewrite`, the `Rewrite` it returns, with the record of
every node and bias share it writes, `emission`), whether a key
projection's share of beta is removed by the attention's Softmax (`softmax_shift`), and what the
emitted nodes cost ONNX Runtime against the LN (`costs`: a measured cost table, the built-in CPU
one or `--costs FILE`; `pricing`: at the tokens the LN runs at; docs/DESIGN.md section 4.1), which
keeps an LN whose fold costs more, or that its table cannot show cheaper (`cost_refusal`).

Takes an `LnCandidate` and the options; gives a `Rewrite` (plain data bound to the IR) or the
`Blocked` of the cost rule. Changes nothing; `apply.rewrite` writes what it decides, and the
check's read-back reads the written file back against the same record.
"""
