"""perfscope's configuration search (``perfscope tune``), guided by the profile's verdict."""
