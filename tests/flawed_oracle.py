"""A drafter whose drafts are partly wrong, for loop and policy tests that need ragged acceptance (tests/ is on
pytest's pythonpath)."""

from specfamily.core.types import Draft
from specfamily.testing import OracleDrafter


class FlawedOracle(OracleDrafter):
    """The target's greedy continuation with every 4th position's token wrong: a pass accepts 0 to 3 tokens."""

    def propose(self, ctx, gamma):
        draft = super().propose(ctx, gamma)
        position = len(ctx.tokens)
        wrong = [(t + 1) % 64 if (position + i) % 4 == 3 else t for i, t in enumerate(draft.tokens.tolist())]
        return Draft.chain(wrong)
