//! weft examples live in this folder as `[[example]]` targets.
