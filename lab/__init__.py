"""The diffusers fix lab: prove that a performance fix works, with evidence."""

__version__ = "0.1.0"
