"""Report (step 7): what the fold did, for people and programs. `FoldReport` (`fold_report`): a
summary line, the node counts, every LN grouped by what it became or why it stays (by its code),
the centered constants, the verification figures; `to_json()` the same as data. The `-v` proof
per LN comes from `trace`.
"""
