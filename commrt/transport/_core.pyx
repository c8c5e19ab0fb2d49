# placeholder, replaced by the transport core
def version():
    return 0
