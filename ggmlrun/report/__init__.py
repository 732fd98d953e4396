"""Rich tables and JSON objects from result objects. Nothing here computes a result.

One module per kind of result, so each reads in one sitting: `table` (the `Table` every
command prints and the text rules of its cells), `graph` (a graph's schedule and memory:
`plan`, `measure`, `ops`, `pack`), `run` (a run's outputs and timings) and `model` (GGUF files
and cards). Callers use `from ggmlrun import report` and `report.<name>`, so the names are
gathered here; each module is imported on the first use of one of its names (PEP 562), so a
command pays only for the reports it prints (`validate` of a model: `model` and `table`).
"""

from importlib import import_module

_NAMES = {
    "graph": ("assignment_table", "cause_legend", "fits_dict", "ggml_dump", "host_line",
              "layer_fit_dict", "layer_fit_line", "measure_dict", "measure_table",
              "offload_note", "ops_dict", "ops_table", "pack_table", "plan_dict",
              "policy_table", "split_table", "summary_dict", "summary_table"),
    "host_growth": ("host_growth_dict", "host_growth_lines", "host_growth_warning"),
    "model": ("draft_dict", "draft_lines", "fit_line", "fit_table", "llamacpp_fit_lines",
              "host_lines", "model_fit_dict", "model_measure_dict",
              "memory_bars", "model_measure_table", "model_run_dict", "model_summary",
              "planned_for_dict", "planned_for_lines", "ran_with_lines", "top_tokens_table"),
    "run": ("modeled_run_s", "outputs_table", "run_dict", "timing_header", "timing_table",
            "timings_dict"),
    "table": ("Bytes", "Column", "Items", "Table", "clean", "pack_line", "plain",
              "print_tables", "seconds_text"),
}
_MODULE_OF = {name: module for module, names in _NAMES.items() for name in names}
__all__ = list(_MODULE_OF)


def __getattr__(name: str):
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'ggmlrun.report' has no attribute {name!r}")
    value = globals()[name] = getattr(import_module(f"ggmlrun.report.{module}"), name)
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
