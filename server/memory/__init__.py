"""What a session remembers of what the camera saw: moments (keyframes with their times) and notes
(transcripts, questions, answers, watch fires, captions), stored in SQLite or PostgreSQL behind one
interface (``store.MemoryStore``); ``factory.open_store`` picks the backend from a URL."""
