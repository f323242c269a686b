"""Save (step 6): the output written to a temporary file in the destination folder and renamed
into place only once verification passed (`staged.StagedModel`); the input is never the
destination unless asked; weights go to external data above protobuf's 2 GiB limit. What the
fold did (`provenance`) is added to the written model's metadata_props as it is committed.
"""
