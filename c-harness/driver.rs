// placeholder: the C harness driver is being written
