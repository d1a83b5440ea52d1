"""receiver package."""
