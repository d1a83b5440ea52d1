"""tape package."""
