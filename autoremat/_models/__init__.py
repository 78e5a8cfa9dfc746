"""The built-in models: the seed LSTM (``seed_lstm``) and the layer stack
(``layer_stack``), each a ``Problem`` the measurement and the search take like a user's."""
