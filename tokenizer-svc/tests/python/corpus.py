"""The conversation corpus both the Python oracle and kvindex-tokenizer render.

Each case is one `apply_chat_template` call: messages plus tools, documents, kwargs and the
generation flags. The Rust side receives the same case as a `ChatRequest` JSON object, so the
keys below mirror `ChatRequest`'s fields.
"""

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search_docs",
        "description": "Full-text search over the knowledge base <internal & \"quoted\">.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "limit": {"type": "integer", "default": 5, "minimum": 1, "maximum": 50},
                "score": {"type": "number", "default": 0.5},
            },
            "required": ["query"],
        },
    },
}

_PARAGRAPHS = [
    "The prefix cache stores key/value blocks of previously seen prompts so that a new request "
    "sharing the same beginning can skip recomputing attention for those tokens.",
    "Routers that render chat templates differently from the engine produce different token ids, "
    "and a single differing token near the start invalidates every block after it.",
    "Unicode matters too: naïve café façade, Ελληνικά, русский текст, 中文分词测试, 日本語のテキスト, "
    "한국어 문장, العربية, עברית, हिन्दी, and emoji 🚀🔥👩‍💻🇫🇷 all tokenize into several byte-level pieces.",
    "Numbers such as 3.14159, 2026-11-29, 1,234,567 and 0xDEADBEEF are split by the digit rule "
    "of the pre-tokenizer into groups of at most three digits.",
    "    Indented code:\n    def f(x):\n        return x * 2\n\n\tTabs\tand  double  spaces  too.",
]


def long_text(approx_tokens):
    out, i = [], 0
    # Each paragraph is roughly 40-60 tokens with the DeepSeek vocabulary.
    while len(out) * 45 < approx_tokens:
        out.append(f"[{i}] " + _PARAGRAPHS[i % len(_PARAGRAPHS)])
        i += 1
    return "\n\n".join(out)


def case(name, messages, **kw):
    c = {
        "name": name,
        "messages": messages,
        "tools": kw.get("tools"),
        "documents": kw.get("documents"),
        "add_generation_prompt": kw.get("add_generation_prompt", True),
        "continue_final_message": kw.get("continue_final_message", False),
        "template_kwargs": kw.get("template_kwargs", {}),
    }
    return c


SYSTEM = {"role": "system", "content": "You are a concise assistant. Answer in English."}


def cases():
    u = lambda t: {"role": "user", "content": t}
    a = lambda t: {"role": "assistant", "content": t}
    return [
        case("user_only", [u("Hello! How are you?")]),
        case("system_user", [SYSTEM, u("What is a KV cache?")]),
        case("multi_turn_gen", [SYSTEM, u("Hi"), a("Hello! How can I help?"), u("Explain prefix caching in one line.")]),
        case("multi_turn_no_gen", [u("Hi"), a("Hello! How can I help?"), u("Thanks"), a("You're welcome.")],
             add_generation_prompt=False),
        case("unicode_emoji", [SYSTEM, u("Traduis: « naïve café » — 你好，世界！ 👩‍👩‍👧‍👦🚀 مرحبا Ω≈ç√∫")]),
        case("empty_content", [u(""), a(""), u("")]),
        case("whitespace_edges", [u("  leading and trailing  \n\n"), a("\nok\n"), u("\t tabs \t")]),
        case("tools_available", [SYSTEM, u("What's the weather in Paris?")], tools=[WEATHER_TOOL, SEARCH_TOOL]),
        case("tool_call_round_trip", [
            u("What's the weather in Paris?"),
            {"role": "assistant", "content": "",
             "tool_calls": [{"id": "call_1", "type": "function",
                             "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]},
            {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "{\"temperature\": 21, \"sky\": \"clear\"}"},
        ], tools=[WEATHER_TOOL]),
        case("content_parts", [
            {"role": "system", "content": [{"type": "text", "text": "You read carefully."}]},
            {"role": "user", "content": [{"type": "text", "text": "Part one."}, {"type": "text", "text": "Part two."}]},
        ]),
        case("thinking_disabled", [u("Quick: 2+2?")], template_kwargs={"enable_thinking": False}),
        case("thinking_enabled", [u("Quick: 2+2?")], template_kwargs={"enable_thinking": True}),
        case("reasoning_history", [
            u("What is 17*3?"),
            {"role": "assistant", "content": "51", "reasoning_content": "17*3 = 51."},
            u("And 17*4?"),
        ]),
        case("continue_final", [u("Write a haiku about caches."), a("Blocks of memory")],
             add_generation_prompt=False, continue_final_message=True),
        case("documents", [u("What does the report say?")],
             documents=[{"title": "Report", "text": "Latency fell by 40% after enabling prefix caching."},
                        {"title": "Notes", "text": "Hit rate was 73%."}]),
        case("long_context_8k", [SYSTEM, u(long_text(8000)), a("Summarised."), u("Now list three key points.")]),
    ]


TOKENIZE_TEXTS = [
    "Hello world",
    "",
    "  spaces   and\ttabs\n\nnewlines ",
    "naïve café 你好 🚀👩‍💻 مرحبا 12345678 3.14",
    "<｜begin▁of▁sentence｜>special in text<｜end▁of▁sentence｜>",
]
