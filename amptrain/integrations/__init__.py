"""amptrain inside the trainers users already have: ``DiagnoseCallback`` for Hugging Face
(:mod:`.hf`, ``pip install 'amptrain[hf]'``) and Lightning (:mod:`.lightning`,
``pip install 'amptrain[lightning]'``); the shared logic is :mod:`.core`. Each adapter is
imported on its own, so neither library is needed for the other."""
