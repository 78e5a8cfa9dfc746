"""autoremat: the fastest remat schedule for a scan that fits a memory budget."""
from autoremat._scan import scan as scan
from autoremat._schedule import Level as Level
from autoremat._schedule import Policy as Policy
from autoremat._schedule import Schedule as Schedule
from autoremat._schedule import ScheduleError as ScheduleError
from autoremat._schedule import load_schedule as load_schedule
from autoremat._schedule import save_schedule as save_schedule
