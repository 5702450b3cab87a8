"""Operator inspection (FEATURE_INSPECT): what this broker holds, read-only."""
