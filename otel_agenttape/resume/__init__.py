"""resume package."""
