"""The folder of the Streamlit entry script (see streamlit_app.py)."""
