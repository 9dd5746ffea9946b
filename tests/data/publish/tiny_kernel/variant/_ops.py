# A real build names its torch.ops namespace after the .so; this stand-in has none.
ops = None
