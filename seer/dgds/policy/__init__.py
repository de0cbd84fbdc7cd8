"""How many tokens to draft: Algorithm 1 as pure functions (``draft_length``) and the online
acceptance and step-cost estimates an engine feeds it (``adaptive``)."""
