"""Test-suite wide configuration. Tier-specific fixtures live in each tier's conftest."""
