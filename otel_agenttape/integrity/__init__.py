"""integrity package."""
