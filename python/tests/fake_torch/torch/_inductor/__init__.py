# PyTorch imports torch._inductor lazily (torch.__getattr__), and its
# symbolisation of Python stack frames asks for it (hasattr(torch,
# "_inductor")) in whatever thread symbolises. The tests read which thread
# imported this stand-in.
import threading

IMPORTED_BY = threading.current_thread().name
