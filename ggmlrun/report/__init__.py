"""Rich tables and JSON objects from result objects. Nothing here computes a result.

One module per kind of result, so each reads in one sitting: `table` (the `Table` every
command prints and the text rules of its cells), `graph` (a graph's schedule and memory:
`plan`, `measure`, `ops`, `pack`), `run` (a run's outputs and timings) and `model` (GGUF files
and cards). Callers use `from ggmlrun import report` and `report.<name>`, so the names are
gathered here.
"""

from ggmlrun.report.graph import (assignment_table, fits_dict, ggml_dump, host_line,
                                  layer_fit_dict, layer_fit_line, measure_dict, measure_table,
                                  offload_note, ops_dict, ops_table, pack_table, plan_dict,
                                  policy_table, split_table, summary_dict, summary_table)
from ggmlrun.report.model import (fit_line, fit_table, host_lines, model_fit_dict, model_measure_dict,
                                  memory_bars, model_measure_table, model_run_dict, model_summary,
                                  planned_for_dict, planned_for_lines, ran_with_lines,
                                  top_tokens_table)
from ggmlrun.report.run import (modeled_run_s, outputs_table, run_dict, timing_header,
                                timing_table, timings_dict)
from ggmlrun.report.table import (Bytes, Column, Items, Table, clean, pack_line, plain, print_tables,
                                  seconds_text)

__all__ = [
    "assignment_table", "fits_dict", "ggml_dump", "host_line", "host_lines", "layer_fit_dict",
    "layer_fit_line", "measure_dict", "measure_table", "offload_note", "ops_dict", "ops_table",
    "pack_table", "plan_dict", "policy_table", "split_table", "summary_dict", "summary_table",
    "fit_line", "fit_table", "model_fit_dict", "model_measure_dict", "model_measure_table",
    "memory_bars", "model_run_dict", "model_summary", "planned_for_dict", "planned_for_lines",
    "ran_with_lines", "top_tokens_table", "modeled_run_s", "outputs_table", "run_dict",
    "timing_header", "timing_table", "timings_dict", "Bytes", "Column", "Items", "Table", "clean",
    "pack_line", "plain",
    "print_tables", "seconds_text",
]
