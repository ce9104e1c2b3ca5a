"""The what-if explorer's jobs other than drawing (``app.py`` at the repository root draws with
Streamlit): :mod:`.inputs` checks uploads and sidebar values and runs the search (``api.answer``,
as the ``simulate`` command does), :mod:`.words` phrases messages, sources, days and dollars,
:mod:`.charts` builds the charts' and tables' data, :mod:`.verdict` prices the plan and holds it
against the budget and deadline, :mod:`.downloads` builds the files the download buttons serve.
No module here imports Streamlit."""
