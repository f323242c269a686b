"""Analysis (step 3, pure): for every recognized LN, whether it folds and what to center.

Takes the model, its `ShapeTable` and the LN candidates; gives a `BoundPlan` (`bound`): the
`CenteringPlan` (`plan`), plain data: every LN's `LnDecision` (folded, or kept with the `Blocked`
that kept it), every constant to center (`CenteringEdit`) and every explicit centering
(`AuxCentering`); and beside it the IR objects each of them changes, for the steps that act on
the model. Mutates nothing.

`planner.plan_for` runs the steps, one module each (docs/DESIGN.md sections 2 and 3): the
backward proof that an LN input is zero-mean once constants are centered (`zero_mean`), the
forward side-effect rule over what those edits change (`side_effects`, with the LNs as sinks:
`sinks`), which LNs fold together and where an explicit centering pays (`fold_set`), and the
edits themselves (`edits`).
"""
