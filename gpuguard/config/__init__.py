"""Configuration files: YAML with positions, schemas, the profile, the rule pack."""
