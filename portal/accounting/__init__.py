"""Cost accounting: usage from allocation history, priced with ``policies.pricing``."""

from portal.accounting.history import usage_intervals
from portal.accounting.prices import PriceConfig, load_price_config, price_config
from portal.accounting.service import (
    Accounting,
    BudgetKind,
    BudgetStatus,
    CostReport,
    Step,
    UtilizationSource,
)

__all__ = [
    "Accounting",
    "BudgetKind",
    "BudgetStatus",
    "CostReport",
    "PriceConfig",
    "Step",
    "UtilizationSource",
    "load_price_config",
    "price_config",
    "usage_intervals",
]
