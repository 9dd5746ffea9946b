// placeholder: the stand-in build is pure Python
