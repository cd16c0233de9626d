"""ibci-fewshot."""
