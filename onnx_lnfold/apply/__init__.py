"""Apply (step 4): carry out a plan on the model it was made on (`apply_plan`): center
the constants (`centering`, float64 arithmetic, lazy until written), untie or derive the shared
ones, insert the explicit centerings, rewrite each folded LN into its RMSNorm op (`rewrite`, as
its rewrite's record says), each new node noting the LN it stands for and why (`notes`), and
remove the constants only the replaced nodes read (`orphans`).

Takes the model and its `BoundPlan` (the plan with the IR objects it changes, `analysis.bound`);
mutates the model in place; gives nothing back.
"""
