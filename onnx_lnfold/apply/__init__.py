"""Apply (step 4): carry out a `CenteringPlan` on the model it was made on (`apply_plan`): center
the constants (`centering`, float64 arithmetic, lazy until written), untie or derive the shared
ones, insert the explicit centerings, rewrite each folded LN into its RMSNorm op (`rewrite`).

Takes the model and its plan; mutates the model in place; gives nothing back.
"""
