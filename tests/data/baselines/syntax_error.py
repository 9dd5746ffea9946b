def get_inputs(:
    pass
