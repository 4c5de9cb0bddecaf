"""Drafters: everything that proposes a DraftTree. Vanilla decoding is ``drafter=None``."""
from ..engine.protocol import AcceptedStep, Drafter, Proposal, TreeDrafter
from .prompt_lookup import PromptLookupDrafter

__all__ = ["AcceptedStep", "Drafter", "Proposal", "PromptLookupDrafter", "TreeDrafter"]
